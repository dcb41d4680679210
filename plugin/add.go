package plugin

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/rdma-netns/rdma-netns/pkg/deviceinfo"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// Add moves the RDMA device of the pod's netdev into the pod netns.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	c, err := p.newCall(args)
	if err != nil {
		return err
	}
	if err := c.add(); err != nil {
		c.log.Errorf("ADD failed: %v", err)
		return err
	}
	return nil
}

func (c *call) add() error {
	if c.conf.Result == nil {
		return types.NewError(types.ErrInvalidNetworkConfig,
			"rdma-netns needs a prevResult: it is a meta-plugin and must follow the plugin that moves the netdev into the pod (host-device, sriov) in a plugin chain", "")
	}
	if err := c.key().Validate(); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	podNS, err := ns.GetNS(c.args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("cannot use pod netns %q: %v", c.args.Netns, err), "")
	}
	podNS.Close()

	if err := c.exclusive(); err != nil {
		if c.conf.AllowSharedMode {
			c.log.Warnf("RDMA device left unisolated because allowSharedMode is set: %v", err)
			return c.printResult()
		}
		return err
	}
	podName := c.conf.PodDevName()
	if podName.Value != "" {
		if err := state.ValidateDeviceName(podName.Value); err != nil {
			return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
		}
	}

	unlock, err := c.openStore()
	if err != nil {
		return err
	}
	defer unlock()

	done, err := c.resume()
	if err != nil || done {
		return err
	}
	dev, err := c.resolve()
	if err != nil {
		return err
	}
	if owner, err := c.store.Owner(dev.Name); err == nil && owner.Key != c.key() {
		return fmt.Errorf("RDMA device %s is already attached to %s (netns %s); nothing was changed. Give this pod another device or remove the other attachment first", dev.Name, owner.Key, owner.Netns)
	} else if err != nil && !errors.Is(err, state.ErrNotFound) {
		return fmt.Errorf("cannot check who owns RDMA device %s: %v", dev.Name, err)
	}
	if podName.Value != "" && podName.Value != dev.Name {
		if err := c.nameFree(podName.Value); err != nil {
			return err
		}
	}

	rec := &state.Record{
		Key:        c.key(),
		Netns:      c.args.Netns,
		Device:     dev.Name,
		DevPath:    dev.DevPath,
		PCIAddress: dev.PCIAddress,
		Rule:       dev.Rule,
		State:      state.StateMoving,
		Created:    time.Now().UTC(),
	}
	if podName.Value != dev.Name {
		rec.PodName = podName.Value
	}
	return c.attach(rec)
}

// attach performs the move. The record is written first as "moving" so a
// crash at any later point leaves enough for DEL or a retried ADD to finish
// or undo the job; every later failure undoes what was done.
func (c *call) attach(rec *state.Record) error {
	if err := c.store.Put(rec); err != nil {
		return fmt.Errorf("cannot record the attachment of RDMA device %s before moving it: %v; nothing was changed", rec.Device, err)
	}
	var undo []func() error
	rollback := func(cause error) error {
		for i := len(undo) - 1; i >= 0; i-- {
			if err := undo[i](); err != nil {
				c.log.Errorf("rollback: %v", err)
				return fmt.Errorf("%v; rolling back also failed: %v (the attachment record was kept so DEL can finish the cleanup)", cause, err)
			}
		}
		if err := c.store.Delete(rec.Key); err != nil {
			c.log.Errorf("rollback: removing the record: %v", err)
		}
		return cause
	}

	if err := c.p.Kernel.MoveToNetns(rec.Device, c.args.Netns); err != nil {
		return rollback(err)
	}
	undo = append(undo, func() error { return c.p.Kernel.MoveToHost(rec.Device, c.args.Netns) })
	c.log.Infof("moved RDMA device %s into netns %s", rec.Device, c.args.Netns)

	if rec.PodName != "" {
		if err := c.p.Kernel.Rename(c.args.Netns, rec.Device, rec.PodName); err != nil {
			return rollback(fmt.Errorf("cannot rename RDMA device %s to %s inside the pod: %v", rec.Device, rec.PodName, err))
		}
		// The device must carry its host name again before it leaves.
		undo[len(undo)-1] = func() error {
			if err := c.p.Kernel.Rename(c.args.Netns, rec.PodName, rec.Device); err != nil {
				return err
			}
			return c.p.Kernel.MoveToHost(rec.Device, c.args.Netns)
		}
		c.log.Infof("renamed RDMA device %s to %s inside the pod", rec.Device, rec.PodName)
	}

	if q := c.qos(); q != nil {
		if err := c.p.Kernel.ApplyQoS(c.args.Netns, rec.InPod(), *q); err != nil {
			return rollback(fmt.Errorf("cannot apply rdmaQoS to RDMA device %s: %v", rec.InPod(), err))
		}
		rec.QoS = true
		undo = append(undo, func() error { return c.p.Kernel.ClearQoS(rec.InPod()) })
		c.log.Infof("applied rdmaQoS to RDMA device %s", rec.InPod())
	}

	rec.State = state.StateAttached
	if err := c.store.Put(rec); err != nil {
		return rollback(fmt.Errorf("cannot record the attachment of RDMA device %s: %v", rec.Device, err))
	}
	if path := c.conf.RuntimeConfig.CNIDeviceInfoFile; path != "" {
		if err := deviceinfo.Write(path, rec.PCIAddress, rec.InPod()); err != nil {
			return rollback(err)
		}
	}
	return c.printResult()
}

// resume handles a repeated ADD: when this attachment's device is already in
// this pod there is nothing to move. A record left by an interrupted ADD
// whose device never left the host is dropped so the ADD starts afresh.
func (c *call) resume() (bool, error) {
	rec, err := c.store.Get(c.key())
	switch {
	case errors.Is(err, state.ErrNotFound):
		return false, nil
	case errors.Is(err, state.ErrCorrupt):
		c.log.Warnf("dropping unreadable record of this attachment: %v", err)
		return false, c.store.Delete(c.key())
	case err != nil:
		return false, err
	}
	if rec.Netns == c.args.Netns {
		in, err := c.p.Kernel.InNetns(c.args.Netns, rec.InPod())
		if err != nil {
			return false, err
		}
		if in {
			if rec.State != state.StateAttached {
				rec.State = state.StateAttached
				if err := c.store.Put(rec); err != nil {
					return false, err
				}
			}
			c.log.Infof("RDMA device %s is already in this pod; nothing to do", rec.InPod())
			if path := c.conf.RuntimeConfig.CNIDeviceInfoFile; path != "" {
				if err := deviceinfo.Write(path, rec.PCIAddress, rec.InPod()); err != nil {
					return false, err
				}
			}
			return true, c.printResult()
		}
	}
	// The device is not in this pod: an interrupted ADD, or a record for a
	// previous sandbox with the same ID. An ADD killed between the move and
	// the rename left it in this pod under its host name: take it back so
	// this ADD starts afresh. Put a renamed device's name back.
	if rec.PodName != "" && rec.Netns == c.args.Netns {
		if in, err := c.p.Kernel.InNetns(c.args.Netns, rec.Device); err != nil {
			return false, err
		} else if in {
			if err := c.p.Kernel.MoveToHost(rec.Device, c.args.Netns); err != nil {
				return false, err
			}
		}
	}
	if rec.PodName != "" {
		if in, _ := c.p.Kernel.InHost(rec.PodName); in {
			if err := c.p.Kernel.Rename("", rec.PodName, rec.Device); err != nil {
				return false, err
			}
		}
	}
	c.log.Infof("dropping stale record of %s (device %s, netns %s)", rec.Key, rec.Device, rec.Netns)
	return false, c.store.Delete(c.key())
}

// nameFree refuses a pod-side name that another device already has: RDMA
// device names are unique across all namespaces, so the rename would fail
// only after the device had moved.
func (c *call) nameFree(name string) error {
	in, err := c.p.Kernel.InHost(name)
	if err != nil {
		return err
	}
	if in {
		return fmt.Errorf("cannot name the RDMA device %s inside the pod: the host already has a device of that name; choose another rdmaDevName", name)
	}
	if owner, err := c.store.Owner(name); err == nil && owner.Key != c.key() {
		return fmt.Errorf("cannot name the RDMA device %s inside the pod: %s already uses that name; choose another rdmaDevName", name, owner.Key)
	}
	return nil
}

// printResult passes prevResult on in the version the runtime asked for.
func (c *call) printResult() error {
	res, err := c.conf.Result.GetAsVersion(c.conf.CNIVersion)
	if err != nil {
		return fmt.Errorf("cannot convert the result to version %s: %v", c.conf.CNIVersion, err)
	}
	out := c.p.Out
	if out == nil {
		out = os.Stdout
	}
	return res.PrintTo(out)
}
