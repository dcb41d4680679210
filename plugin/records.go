package plugin

import (
	"fmt"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// loadRecords reads every attachment record once per call, under the node
// lock. An unreadable record can tell us nothing we could act on, so it is
// moved aside for the operator (`rdma-netns doctor` lists it) instead of
// blocking every pod on the node.
func (c *call) loadRecords() ([]*state.Record, error) {
	recs, err := c.store.List()
	if err == nil {
		return recs, nil
	}
	bad := state.CorruptPaths(err)
	if len(bad) == 0 {
		return nil, fmt.Errorf("cannot read the attachment records in %s: %v", c.store.Dir(), err)
	}
	for _, path := range bad {
		c.quarantine(path)
	}
	return recs, nil
}

func (c *call) quarantine(path string) {
	dst, err := c.store.Quarantine(path)
	if err != nil {
		c.log.Errorf("unreadable attachment record %s: %v; remove it by hand", path, err)
		return
	}
	c.log.Warnf("moved unreadable attachment record %s to %s; it no longer counts for any device", path, dst)
}

// sameNetns reports whether rec's netns path still opens the netns the
// record was written for.
func sameNetns(rec *state.Record) bool {
	_, ok := inventory.SameNetns(rec, inventory.Identify)
	return ok
}

// reconcile drops the records of other attachments that the kernel shows
// to be stale, and returns the rest. A device the host can see is held by
// no pod: its record is left over from an interrupted ADD or a pod netns
// destroyed without DEL (a node reboot leaves every record so). A device
// that came back from a destroyed netns under its pod-side name gets its
// host name back first, since only the record knows it. A record whose
// netns is gone and that has nothing left to undo goes too. Each record
// costs a look at its own device names, not a listing of the node's.
func (c *call) reconcile(recs []*state.Record) ([]*state.Record, error) {
	var live []*state.Record
	for _, rec := range recs {
		if rec.Key == c.key() {
			live = append(live, rec)
			continue
		}
		stale, err := c.dropIfStale(rec)
		if err != nil {
			return nil, err
		}
		if !stale {
			live = append(live, rec)
		}
	}
	return live, nil
}

// dropIfStale removes rec if the kernel shows it stale. A record whose
// device another call is moving is that call's to write: it counts as
// live, whatever the kernel shows halfway through the move.
func (c *call) dropIfStale(rec *state.Record) (bool, error) {
	unlock, ok, err := c.tryLockDevice(rec.Device)
	if err != nil || !ok {
		return false, err
	}
	defer unlock()
	stale, err := c.staleClaim(rec)
	if err != nil || !stale {
		return false, err
	}
	c.clearQoS(rec)
	return true, c.store.Delete(rec.Key)
}

// staleClaim decides one record of another attachment, restoring the host
// name of its device when the kernel returned it under the pod-side name.
func (c *call) staleClaim(rec *state.Record) (bool, error) {
	if in, err := c.p.Sysfs.Has(rec.Device); err != nil || in {
		if in {
			c.log.Infof("record of %s claims RDMA device %s, which is in the host, so no pod holds it: removing the stale record (its pod netns %s was destroyed without DEL, or its ADD was interrupted)", rec.Key, rec.Device, rec.Netns)
		}
		return in, err
	}
	if rec.PodName != "" {
		in, err := c.p.Sysfs.Has(rec.PodName)
		if err != nil {
			return false, err
		}
		if !in {
			return false, nil
		}
		if err := c.p.Kernel.Rename("", rec.PodName, rec.Device); err != nil {
			c.log.Warnf("RDMA device %s came back to the host as %s (pod netns %s of %s is gone) and cannot get its name back: %v", rec.Device, rec.PodName, rec.Netns, rec.Key, err)
			return false, nil
		}
		c.hostDevs = nil // resolution lists the renamed device afresh
		c.log.Infof("RDMA device %s came back to the host as %s from the destroyed pod netns %s of %s: renamed it back and removed the stale record", rec.Device, rec.PodName, rec.Netns, rec.Key)
		return true, nil
	}
	if !sameNetns(rec) {
		c.log.Infof("record of %s names pod netns %s, which no longer exists: removing it (the kernel returns its RDMA device %s to the host)", rec.Key, rec.Netns, rec.Device)
		return true, nil
	}
	return false, nil
}

// hostDevices lists the RDMA devices the host sees, once per call: the
// same listing serves resolution and reconciliation.
func (c *call) hostDevices() ([]rdmadev.Device, error) {
	if c.hostDevs == nil {
		devs, err := c.p.Sysfs.Devices()
		if err != nil {
			return nil, err
		}
		c.hostDevs = devs
	}
	return c.hostDevs, nil
}

// who names the attachment of rec for an error that reaches the caller's
// pod events. Another tenant's pod is none of the caller's business: its
// name, sandbox and netns are named only to a pod of the same Kubernetes
// namespace (or to a caller outside Kubernetes, such as cnitool, when the
// holder is outside it too); the node's log has them.
func (c *call) who(rec *state.Record) string {
	if rec.K8sNamespace != c.conf.Pod.Namespace {
		c.log.Infof("RDMA device %s is held by %s", rec.Device, holder(rec))
		return "a pod in another namespace"
	}
	return holder(rec)
}

// heldBy says who holds rec's device and what the caller can do.
func (c *call) heldBy(rec *state.Record) string {
	if rec.K8sNamespace != c.conf.Pod.Namespace {
		return "held by " + c.who(rec) + "; nothing was changed. Give this pod another NIC or RDMA device, or ask the cluster's operator which network to use"
	}
	return "held by " + c.who(rec) + "; nothing was changed. Delete the pod that holds it, or give this pod another NIC or RDMA device"
}

// holder names the attachment of rec as the operator knows it: the pod's
// namespace/name when the runtime passed them (kubelet does, through
// K8S_POD_*), then the runtime's own key and the netns, which say which
// sandbox it is when two pods of one name were made in turn.
func holder(rec *state.Record) string {
	key := fmt.Sprintf("attachment %s, netns %s", rec.Key, rec.Netns)
	if rec.K8sPod == "" {
		return key
	}
	return fmt.Sprintf("pod %s/%s (%s)", rec.K8sNamespace, rec.K8sPod, key)
}

// liveClaim finds the record of another attachment that still holds the
// device named name: its netns is the recorded one. Devices in the host
// were reconciled away before, so a remaining claim is on a device the
// host cannot see.
func liveClaim(recs []*state.Record, self state.Key, name string) *state.Record {
	for _, r := range recs {
		if r.Key != self && (r.Device == name || r.PodName == name) && sameNetns(r) {
			return r
		}
	}
	return nil
}
