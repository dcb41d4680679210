package plugin

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// Del returns the attachment's RDMA device to the host. It runs before the
// netdev plugin's DEL (chains delete in reverse), so the netdev is still in
// the pod. It succeeds whenever there is nothing left to undo.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	c, err := p.newCall(args, false)
	if err != nil {
		return err
	}
	if err := c.del(); err != nil {
		c.log.Errorf("DEL failed: %v", err)
		return err
	}
	return nil
}

// del returns the RDMA device first, so that it leaves the pod with its
// NIC's netdev still there, and in dra mode then has host-device take the
// NIC out; a failure keeps the NIC in the pod for the runtime's retry.
func (c *call) del() error {
	if c.conf.Claims {
		return c.delClaims()
	}
	var err error
	if c.conf.DRA == nil {
		err = c.delRDMA(nil)
	} else {
		err = c.delRDMA(c.delClaimedNICOf)
	}
	if err != nil || strings.HasPrefix(c.conf.Name, claimNetworkPrefix) {
		return err
	}
	// Multus v4.3.0's daemon runs a sandbox's DEL from its cache, with a
	// copy of each configuration holding only the keys it knows: the
	// claims entry reaches DEL as a bare {"type": "rdma-netns"}, and
	// cannot be told from any other entry. So the DEL of every entry
	// takes back the sandbox's claimed NICs (DEL runs only when the
	// sandbox goes, or when its ADD failed); those of a NIC's own call
	// (network claim-<UID>) do not, or they would call themselves.
	return c.delClaims()
}

// delClaimedNICOf takes the claimed NIC out of the pod and gives the host
// back what rec (nil when none) remembers of it.
func (c *call) delClaimedNICOf(rec *state.Record) error {
	if err := c.delClaimedNIC(); err != nil {
		return err
	}
	return c.restoreRecorded(rec)
}

// delRDMA returns the attachment's RDMA device, then runs home (nil for
// none) with its record, or nil when there is none: the record is
// deleted only once home succeeded, so a retried DEL still has it.
func (c *call) delRDMA(home func(*state.Record) error) error {
	if home == nil {
		home = func(*state.Record) error { return nil }
	}
	if err := c.key().ValidateRuntime(); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	if err := state.ValidateIfName(c.args.IfName); err != nil {
		// The pod chose the name; ADD refuses it before it changes
		// anything, so nothing can be recorded or moved under it. Failing
		// here would stop the chain's DEL before host-device's, which
		// returns the NIC.
		c.log.Infof("nothing to do: ADD refuses this interface name (%v) before it changes anything", err)
		return home(nil)
	}
	if err := c.openStore(); err != nil {
		return err
	}
	// DEL holds the attachment's lock, so it follows an ADD of the same
	// attachment in progress, and its device's lock while it returns it:
	// calls on other attachments and devices run beside it.
	unlock, err := c.lockAttachment()
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := c.store.Get(c.key())
	var corrupt *state.CorruptError
	switch {
	case errors.Is(err, state.ErrNotFound):
		if err := c.releaseUnrecorded(); err != nil {
			return err
		}
		return home(nil)
	case errors.As(err, &corrupt):
		c.quarantine(corrupt.Path)
		if err := c.releaseUnrecorded(); err != nil {
			return err
		}
		return home(nil)
	case err != nil:
		return err
	}
	unlockDev, err := c.lockDevice(rec.Device)
	if err != nil {
		return err
	}
	defer unlockDev()
	if err := c.release(rec, c.args.Netns); err != nil {
		return err
	}
	c.clearQoS(rec)
	if err := home(rec); err != nil {
		return err
	}
	return c.store.Delete(rec.Key)
}

// releaseUnrecorded is DEL without a usable record (the state directory
// was wiped, or the record damaged): the kernel still knows which RDMA
// device in the pod serves CNI_IFNAME, so that one goes back. Its host
// name is lost if it was renamed in the pod; it returns under the pod-side
// name and the log says so.
func (c *call) releaseUnrecorded() error {
	if netnsGone(c.args.Netns) {
		c.log.Debugf("no attachment recorded and no pod netns; nothing to do")
		return nil
	}
	if mode, err := c.p.Kernel.NetnsMode(); err != nil || mode != rdmans.ModeExclusive {
		// Without RDMA, or in shared mode, nothing can have been moved.
		return nil
	}
	dev, err := c.p.Kernel.DeviceOfNetdev(c.args.Netns, c.args.IfName)
	if err != nil {
		return fmt.Errorf("no attachment record, and cannot look for the RDMA device of %s in netns %s: %v; retry DEL", c.args.IfName, c.args.Netns, err)
	}
	if dev == "" {
		c.log.Debugf("no attachment recorded and no RDMA device of %s in the pod; nothing to do", c.args.IfName)
		return nil
	}
	unlock, err := c.lockDevice(dev)
	if err != nil {
		return err
	}
	defer unlock()
	recs, err := c.loadRecords()
	if err != nil {
		return err
	}
	if owner := liveClaim(recs, c.key(), dev); owner != nil && c.isPodNetns(owner) {
		c.log.Infof("RDMA device %s of %s in the pod belongs to %s; leaving it", dev, c.args.IfName, owner.Key)
		return nil
	}
	if err := c.p.Kernel.MoveToHost(dev, c.args.Netns); err != nil {
		return fmt.Errorf("no attachment record; RDMA device %s serves %s in the pod but cannot be returned: %v; retry DEL", dev, c.args.IfName, err)
	}
	if podName := c.podNameForNote(); podName != "" && podName == dev {
		msg := fmt.Sprintf("returned RDMA device %s (the port of %s in netns %s, attachment %s) to the host without an attachment record: it was renamed in the pod and its host name is unknown, so it keeps the name %s; rename it with `rdma dev set %s name <host name>`", dev, c.args.IfName, c.args.Netns, c.key(), dev, dev)
		c.log.Warnf("%s", msg)
		if err := c.store.NoteLostName(dev, msg); err != nil {
			c.log.Warnf("cannot leave a note for rdma-netns doctor: %v", err)
		}
		return nil
	}
	c.log.Infof("returned RDMA device %s (the port of %s) to the host; there was no usable attachment record", dev, c.args.IfName)
	return nil
}

// podNameForNote is the name an unrecorded device may carry in the pod,
// for the note DEL leaves when it cannot restore the host name: the
// network's, or the pod's where the network allowed it. DEL never fails on
// a per-pod value, so a refused or malformed one counts as none.
func (c *call) podNameForNote() string {
	req, err := c.conf.PodRequest()
	if err != nil {
		return c.conf.RdmaDevName
	}
	name, err := c.podDevName(req.DevName)
	if err != nil {
		return c.conf.RdmaDevName
	}
	return name
}

// release brings a recorded device back to the host under its host name,
// wherever it is now. It errors only when the device is in the pod and could
// not be moved, so the record is kept for a retry.
func (c *call) release(rec *state.Record, netnsPath string) error {
	if netnsGone(netnsPath) || (netnsPath == rec.Netns && !sameNetns(rec)) {
		// A path that now opens another netns is not the pod's: its
		// devices are someone else's, and ours went home with the pod.
		c.log.Infof("pod netns %q is gone; the kernel has returned RDMA device %s to the host", netnsPath, rec.Device)
		c.awaitReturn(rec)
		return c.restoreHostName(rec)
	}
	// One visit to the pod: the device is looked for under its pod-side
	// name, then under its host name (an ADD or DEL killed between the
	// move and the rename left it so), renamed back and moved; then the
	// NIC gets back what host-device's DEL goes by.
	nic := c.nicOf(rec)
	found, fix, err := c.p.Kernel.Release(netnsPath, rec.Device, rec.PodName, nic)
	if err != nil {
		return fmt.Errorf("%v; the attachment record is kept, retry DEL", err)
	}
	c.logNICFix(nic, fix)
	if !found {
		c.log.Infof("RDMA device %s is not in netns %s (already back in the host, or gone)", rec.InPod(), netnsPath)
		return c.restoreHostName(rec)
	}
	c.log.Infof("returned RDMA device %s to the host", rec.Device)
	return nil
}

// returnWait bounds how long DEL waits for the kernel to return a renamed
// device from a deleted pod netns: netns cleanup runs asynchronously, and
// a device that comes back after DEL would keep its pod-side name.
const returnWait = 3 * time.Second

// awaitReturn waits until a renamed device is visible in the host again.
// An unrenamed device comes back under the right name on its own.
func (c *call) awaitReturn(rec *state.Record) {
	if rec.PodName == "" {
		return
	}
	deadline := time.Now().Add(returnWait)
	for {
		for _, name := range []string{rec.PodName, rec.Device} {
			if in, err := c.p.Kernel.InHost(name); err == nil && in {
				return
			}
		}
		if time.Now().After(deadline) {
			c.log.Warnf("RDMA device %s (%s in the pod) did not come back to the host within %s of its pod netns being deleted; if it appears later as %s, rename it with `rdma dev set %s name %s`", rec.Device, rec.PodName, returnWait, rec.PodName, rec.PodName, rec.Device)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// restoreHostName renames a device that came back to the host (when its pod
// netns was destroyed) under the name it had in the pod.
func (c *call) restoreHostName(rec *state.Record) error {
	if rec.PodName == "" {
		return nil
	}
	in, err := c.p.Kernel.InHost(rec.PodName)
	if err != nil || !in {
		return err
	}
	if err := c.p.Kernel.Rename("", rec.PodName, rec.Device); err != nil {
		return fmt.Errorf("RDMA device %s came back to the host as %s and cannot get its name back: %v; retry DEL", rec.Device, rec.PodName, err)
	}
	c.log.Infof("renamed RDMA device %s back to %s in the host", rec.PodName, rec.Device)
	return nil
}

// clearQoS drops the rdma_cm settings group of a released device. The
// settings themselves died with the move, so a failure only leaves an
// empty group behind and must not fail DEL.
func (c *call) clearQoS(rec *state.Record) {
	if !rec.QoS {
		return
	}
	if err := c.p.Kernel.ClearQoS(rec.InPod()); err != nil {
		c.log.Warnf("%v", err)
	}
}

// isPodNetns reports whether rec's netns is the one at CNI_NETNS, whatever
// path each names it by.
func (c *call) isPodNetns(rec *state.Record) bool {
	if rec.Netns == c.args.Netns {
		return true
	}
	want, ok := inventory.RecordedID(rec)
	got, err := inventory.Identify(c.args.Netns)
	return ok && err == nil && got == want
}
