package plugin

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/deviceinfo"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// ownNetns is the plugin's own network namespace.
const ownNetns = "/proc/self/ns/net"

// netnsOverridden reports whether the runtime set CNI_NETNS_OVERRIDE: it
// runs the plugin inside the container's netns on purpose, so CNI_NETNS may
// be the plugin's own (skel's rule for its own check after ADD and DEL).
func netnsOverridden(args *skel.CmdArgs) bool {
	return strings.EqualFold(args.NetnsOverride, "true") || args.NetnsOverride == "1"
}

// Add moves the RDMA device of the pod's netdev into the pod netns.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	c, err := p.newCall(args, true)
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
	if err := c.conf.CheckSize(len(c.args.StdinData)); err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	for _, refuse := range []func() error{c.nadLogFile, c.nadStateDir} {
		if err := refuse(); err != nil {
			return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
		}
	}
	if c.conf.Claims {
		return c.addClaims()
	}
	switch {
	case c.conf.DRA != nil && c.conf.PrevResultJSON != nil && string(c.conf.PrevResultJSON) != "null":
		return types.NewError(types.ErrInvalidNetworkConfig,
			"network "+config.Quote(c.conf.Name)+" has \"dra\", so rdma-netns moves the pod's NIC itself (through host-device) and must come first in the plugin chain, but it got a prevResult from a plugin before it; put rdma-netns first and remove host-device from the chain; nothing was changed", "")
	case c.conf.DRA == nil && c.conf.Result == nil:
		return types.NewError(types.ErrInvalidNetworkConfig,
			"rdma-netns needs a prevResult: it is a meta-plugin and must follow the plugin that moves the netdev into the pod (host-device, sriov) in a plugin chain", "")
	}
	if err := c.key().ValidateRuntime(); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if err := state.ValidatePlainIfName(c.args.IfName); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error()+
			"; nothing was changed. Name the pod's interface (the \"interface\" of its network-selection element) with letters, digits, '-', '_' or '.'", "")
	}
	req, err := c.conf.PodRequest()
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	podName, err := c.podDevName(req.DevName)
	if err != nil {
		return types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	// The netns' identity goes into the record: a path such as
	// /proc/PID/ns/net can later open another netns.
	if c.netnsID, err = inventory.Identify(c.args.Netns); err != nil {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("cannot use pod netns %q: %v", c.args.Netns, err), "")
	}
	// What the CNI library's skel refuses after ADD, refused before it: a
	// device "moved" into the plugin's own netns would stay in the host
	// with a record saying a pod has it.
	if own, err := inventory.Stat(ownNetns); err == nil && own == c.netnsID && !netnsOverridden(c.args) {
		return types.NewError(types.ErrInvalidNetNS, "plugin's netns and netns from CNI_NETNS should not be the same", c.args.Netns)
	}
	if c.conf.DRA != nil {
		return c.withClaimedNIC(func() error { return c.moveRDMA(req, podName) })
	}
	return c.moveRDMA(req, podName)
}

// moveRDMA moves the RDMA device of the attachment's NIC into the pod.
func (c *call) moveRDMA(req config.PodRequest, podName string) error {
	if err := c.exclusive(); err != nil {
		if c.conf.AllowSharedMode {
			c.log.Warnf("RDMA device left unisolated because allowSharedMode is set: %v", err)
			return c.printResult()
		}
		return err
	}
	if err := c.openStore(); err != nil {
		return err
	}
	// The pod's netdev is read once, before any lock: resolution takes
	// the device behind it, the record its alias (hostNetdev).
	c.netdev(c.args.IfName)
	unlock, err := c.lockAttachment()
	if err != nil {
		return err
	}
	defer unlock()
	rec, unlockDev, err := c.decide(req, podName)
	if err != nil || rec == nil {
		return err
	}
	defer unlockDev()
	return c.attach(rec)
}

// busyRetries bounds how often ADD decides again after finding its device
// being moved by another call; each wait ends with that call.
const busyRetries = 3

// decide reads the records and chooses this attachment's device under the
// node lock, and takes that device's lock before it lets go of the node
// lock: no other ADD can choose the device until its record is written,
// while ADDs of other devices decide, and then move, in the meantime. A
// nil record means the ADD is complete (a repeated ADD, an adopted device).
func (c *call) decide(req config.PodRequest, podName string) (*state.Record, func(), error) {
	unlockNode, err := c.lockNode()
	if err != nil {
		return nil, nil, err
	}
	defer unlockNode()
	for attempt := 0; ; attempt++ {
		recs, err := c.loadRecords()
		if err != nil {
			return nil, nil, err
		}
		done, err := c.resume(recs)
		if err != nil || done {
			return nil, nil, err
		}
		// After resume: a repeated ADD keeps the name its pod has.
		if err := c.nameNotReserved(req.DevName, podName); err != nil {
			return nil, nil, err
		}
		if recs, err = c.reconcile(recs); err != nil {
			return nil, nil, err
		}
		dev, err := c.resolve(recs, req)
		if err != nil {
			var refused *refusal
			if errors.As(err, &refused) {
				return nil, nil, err
			}
			if adopted, aerr := c.adopt(recs, podName); aerr != nil || adopted {
				return nil, nil, aerr
			}
			return nil, nil, err
		}
		// resolve only picks devices the host can see, and a device the host
		// can see is held by no pod: records never stand in the way here.
		if podName != "" && podName != dev.Name {
			if err := c.nameFree(recs, podName); err != nil {
				return nil, nil, err
			}
		}
		unlockDev, ok, err := c.tryLockDevice(dev.Name)
		if err != nil {
			return nil, nil, err
		}
		if ok {
			return c.newRecord(dev, podName), unlockDev, nil
		}
		if attempt == busyRetries {
			return nil, nil, fmt.Errorf("RDMA device %s stays busy: other ADD or DEL calls keep moving it; retry the ADD", dev.Name)
		}
		// Another call is moving the device (a DEL returning it, an ADD
		// taking it): wait for it to finish, then decide again on what it
		// left, so this ADD says who has the device or takes it.
		c.log.Infof("RDMA device %s is being moved by another call; waiting for it", dev.Name)
		unlockDev, err = c.lockDevice(dev.Name)
		if err != nil {
			return nil, nil, err
		}
		unlockDev()
		c.hostDevs = nil
	}
}

func (c *call) newRecord(dev target, podName string) *state.Record {
	rec := &state.Record{
		Key:        c.key(),
		Netns:      c.args.Netns,
		NetnsDev:   c.netnsID.Dev,
		NetnsIno:   c.netnsID.Ino,
		Device:     dev.Name,
		DevPath:    dev.DevPath,
		PCIAddress: dev.PCIAddress,
		Rule:       dev.Rule,
		State:      state.StateMoving,
		Created:    time.Now().UTC(),

		K8sNamespace: c.conf.Pod.Namespace,
		K8sPod:       c.conf.Pod.Name,
	}
	if podName != dev.Name {
		rec.PodName = podName
	}
	rec.HostNetdev, rec.NetdevParent = c.hostNetdev()
	rec.HostLink = c.hostLink
	return rec
}

// attach performs the move; every failure undoes what was done. The record
// is written once, as "attached", after the move: a crash between the move
// and that write leaves the device in the pod bound to CNI_IFNAME, where
// DEL without a record and a retried ADD find it through the kernel. A
// rename or rdmaQoS follows the move with changes only a record can undo
// (the host name, the rdma_cm settings group), so then the record is also
// written before the move, as "moving".
func (c *call) attach(rec *state.Record) error {
	early := rec.PodName != "" || c.qos() != nil || rec.HostLink != nil
	if early {
		if err := c.store.Put(rec); err != nil {
			return fmt.Errorf("cannot record the attachment of RDMA device %s before moving it: %v; nothing was changed", rec.Device, err)
		}
	}
	var undo []func() error
	rollback := func(cause error) error {
		for i := len(undo) - 1; i >= 0; i-- {
			if err := undo[i](); err != nil {
				c.log.Errorf("rollback: %v", err)
				if !early {
					// The device may still be in the pod: leave DEL a record.
					if perr := c.store.Put(rec); perr != nil {
						c.log.Errorf("rollback: recording the attachment for DEL: %v", perr)
					}
				}
				return fmt.Errorf("%v; rolling back also failed: %v (the attachment record was kept so DEL can finish the cleanup)", cause, err)
			}
		}
		if err := c.store.Delete(rec.Key); err != nil {
			c.log.Errorf("rollback: removing the record: %v", err)
		}
		return cause
	}

	if err := c.moveIn(rec.Device); err != nil {
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

	undoCDI, err := c.writeCDI(rec)
	if err != nil {
		return rollback(err)
	}
	if undoCDI != nil {
		undo = append(undo, undoCDI)
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
	c.reserveNetworkName()
	return c.printResult()
}

// moveIn moves dev into the pod by the kernel index its lock file keeps
// from the last move, when the kernel confirms it, which spares a dump of
// every RDMA device of the host; the index is kept again when it changed.
// Called holding dev's lock, the index's only writer.
func (c *call) moveIn(dev string) error {
	hint, ok := c.store.DeviceIndex(dev)
	if !ok {
		hint = rdmans.NoIndex
	}
	index, err := c.p.Kernel.MoveToNetns(dev, c.args.Netns, hint)
	if err != nil {
		return err
	}
	if index != hint {
		if err := c.store.SetDeviceIndex(dev, index); err != nil {
			c.log.Warnf("%v (the next move of %s looks it up again)", err, dev)
		}
	}
	return nil
}

// resume handles a repeated ADD: when this attachment's device is already in
// this pod there is nothing to move. A record left by an interrupted ADD
// whose device never left the host, or by an earlier sandbox that had the
// same ID (its netns is not this one), is dropped so the ADD starts afresh.
func (c *call) resume(recs []*state.Record) (bool, error) {
	var rec *state.Record
	for _, r := range recs {
		if r.Key == c.key() {
			rec = r
		}
	}
	if rec == nil {
		return false, nil
	}
	// Another attachment's ADD may be moving the device, which this record
	// claimed before: wait for it before looking.
	unlock, err := c.lockDevice(rec.Device)
	if err != nil {
		return false, err
	}
	defer unlock()
	thisPod := rec.Netns == c.args.Netns && sameNetns(rec)
	if thisPod {
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
			// An ADD stopped after the move may not have written the CDI
			// spec the claim's containers need: written again.
			if _, err := c.writeCDI(rec); err != nil {
				return false, err
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
	// An ADD killed between the move and the rename left the device in this
	// pod under its host name: take it back so this ADD starts afresh. Put
	// a renamed device's name back.
	if rec.PodName != "" && thisPod {
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
	c.hostDevs = nil
	c.log.Infof("dropping stale record of %s (device %s, netns %s)", rec.Key, rec.Device, rec.Netns)
	return false, c.store.Delete(c.key())
}

// adopt handles a repeated ADD whose record was lost (state directory
// wiped, record damaged) while the device stayed in the pod: the host no
// longer sees it, but the kernel still binds its port to the pod's netdev.
// Nothing needs to move; the record is written again so DEL can undo the
// attachment. A device renamed in the pod keeps its name: its host name is
// known to no one any more.
func (c *call) adopt(recs []*state.Record, podName string) (bool, error) {
	ifName, err := podNetdev(c.conf.Result, c.args.IfName)
	if err != nil {
		return false, nil
	}
	dev, err := c.p.Kernel.DeviceOfNetdev(c.args.Netns, ifName)
	if err != nil || dev == "" || liveClaim(recs, c.key(), dev) != nil {
		return false, nil
	}
	rec := &state.Record{
		Key: c.key(), Netns: c.args.Netns, NetnsDev: c.netnsID.Dev, NetnsIno: c.netnsID.Ino,
		Device: dev, Rule: "already in the pod, bound to netdev " + ifName, State: state.StateAttached,
		K8sNamespace: c.conf.Pod.Namespace, K8sPod: c.conf.Pod.Name,
	}
	if q := c.qos(); q != nil {
		if err := c.p.Kernel.ApplyQoS(c.args.Netns, dev, *q); err != nil {
			return true, fmt.Errorf("cannot apply rdmaQoS to RDMA device %s: %v", dev, err)
		}
		rec.QoS = true
	}
	if err := c.store.Put(rec); err != nil {
		return true, fmt.Errorf("cannot record the attachment of RDMA device %s: %v", dev, err)
	}
	if _, err := c.writeCDI(rec); err != nil {
		return true, err
	}
	if dev == podName {
		c.log.Warnf("RDMA device %s is already in this pod but its attachment record was lost: DEL returns it under this name, its host name being unknown", dev)
	} else {
		c.log.Infof("RDMA device %s is already in this pod (bound to %s) but its attachment record was lost; recorded it again", dev, ifName)
	}
	if path := c.conf.RuntimeConfig.CNIDeviceInfoFile; path != "" {
		if err := deviceinfo.Write(path, "", dev); err != nil {
			return true, err
		}
	}
	return true, c.printResult()
}

// podDevName is the name the device takes inside the pod: the network's
// rdmaDevName, or the pod's own where the network lets pods name their
// device (podRdmaDevNamePrefix) and the name starts with that prefix.
// Device names are node-wide: a pod naming its device freely could take
// the name another tenant's network gives its devices.
func (c *call) podDevName(s config.Source) (string, error) {
	nad := c.conf.RdmaDevName
	if s.Value == "" || s.Value == nad {
		if nad == "" {
			return "", nil
		}
		return nad, state.ValidateDeviceName(nad)
	}
	prefix := c.conf.PodRdmaDevNamePrefix
	if prefix == "" {
		return "", refuse(s, "this network does not let a pod name its RDMA device (its configuration sets no podRdmaDevNamePrefix)")
	}
	if !strings.HasPrefix(s.Value, prefix) || s.Value == prefix {
		return "", refuse(s, fmt.Sprintf("a name a pod gives its RDMA device on this network must start with %q and go on after it (podRdmaDevNamePrefix)", prefix))
	}
	if err := state.ValidateDeviceName(s.Value); err != nil {
		return "", refuse(s, err.Error())
	}
	return s.Value, nil
}

// reserveNetworkName keeps the name this network gives its pods' devices
// (rdmaDevName) from any pod that names its device itself, on this node
// from the network's first attachment here on (nameNotReserved): written
// once an ADD succeeded, so a refused ADD leaves the node as it was.
// Before a network's first pod on the node, a pod may take its name
// first-come; rdma-netns doctor nads names the prefixes that allow it. A
// failure to reserve blocks no pod.
func (c *call) reserveNetworkName() {
	if nad := c.conf.RdmaDevName; nad != "" {
		if err := c.store.ReserveName(nad, c.conf.Name); err != nil {
			c.log.Warnf("cannot reserve RDMA device name %s for network %s on this node: %v", nad, c.conf.Name, err)
		}
	}
}

// nameNotReserved refuses a name the pod chose itself that another
// network reserved on this node.
func (c *call) nameNotReserved(podPick config.Source, podName string) error {
	if podPick.Value == "" || podName != podPick.Value || podName == c.conf.RdmaDevName {
		return nil
	}
	network, err := c.store.NameReservedBy(podName)
	if err != nil {
		return fmt.Errorf("cannot read the reserved RDMA device names in %s: %v", c.store.Dir(), err)
	}
	if network != "" && network != c.conf.Name {
		c.log.Infof("RDMA device name %s is reserved by network %s", podName, network)
		return refuse(podPick, "another network on this node gives its pods that name (its rdmaDevName); choose another name after the prefix")
	}
	return nil
}

// nameFree refuses a pod-side name that another device already has: RDMA
// device names are unique across all namespaces, so the rename would fail
// only after the device had moved.
func (c *call) nameFree(recs []*state.Record, name string) error {
	in, err := c.p.Kernel.InHost(name)
	if err != nil {
		return err
	}
	if in {
		return fmt.Errorf("cannot name the RDMA device %s inside the pod: the host already has a device of that name; choose another rdmaDevName", name)
	}
	if owner := liveClaim(recs, c.key(), name); owner != nil {
		return fmt.Errorf("cannot name the RDMA device %s inside the pod: %s already uses that name; choose another rdmaDevName", name, c.who(owner))
	}
	return nil
}

// printResult passes prevResult on in the version the runtime asked for.
func (c *call) printResult() error {
	out := c.p.Out
	if out == nil {
		out = os.Stdout
	}
	if c.conf.Result == nil {
		// A "claims" entry first in its chain, and no claimed NIC: no
		// plugin's result to pass on.
		return (&current.Result{CNIVersion: c.conf.CNIVersion}).PrintTo(out)
	}
	return c.conf.PrintResult(out)
}
