package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// Status reports whether ADDs can succeed: the RDMA subsystem answers and is
// in exclusive mode (or the operator allowed shared mode).
func (p *Plugin) Status(args *skel.CmdArgs) error {
	c, err := p.newCall(args, false)
	if err != nil {
		return err
	}
	if c.conf.Claims {
		// An entry of the node's primary network: its STATUS failing
		// would stop every pod of the node, with or without a claim. A
		// claim's pod is refused at its ADD instead, saying why.
		return nil
	}
	if err := c.exclusive(); err != nil && !c.conf.AllowSharedMode {
		return types.NewError(types.ErrPluginNotAvailable, "rdma-netns is not ready", err.Error())
	}
	return nil
}

// GC removes the records of this network's attachments that the runtime no
// longer knows, returning their devices to the host.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	c, err := p.newCall(args, false)
	if err != nil {
		return err
	}
	if err := c.gc(); err != nil {
		c.log.Errorf("GC failed: %v", err)
		return err
	}
	return nil
}

func (c *call) gc() error {
	if c.conf.Claims {
		// The runtime's GC names the primary network's attachments
		// only: the claims' attachments (networks "claim-<UID>") go with
		// each sandbox's DEL.
		return nil
	}
	valid := map[state.Key]bool{}
	for _, a := range c.conf.ValidAttachments {
		valid[state.Key{Network: c.conf.Name, ContainerID: a.ContainerID, IfName: a.IfName}] = true
	}
	if err := c.openStore(); err != nil {
		return err
	}
	unlock, err := c.lockNode()
	if err != nil {
		return err
	}
	defer unlock()

	recs, err := c.loadRecords()
	if err != nil {
		return err
	}
	var errs []error
	for _, rec := range recs {
		if rec.Network != c.conf.Name || valid[rec.Key] {
			continue
		}
		if err := c.collect(rec); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", rec.Key, err))
		}
	}
	return errors.Join(errs...)
}

// collect returns the device of a record the runtime no longer knows and
// removes the record, holding the attachment's and the device's locks.
func (c *call) collect(rec *state.Record) error {
	unlockAtt, ok, err := c.store.TryLockAttachment(rec.Key)
	if err != nil || !ok {
		// An ADD or DEL of the attachment is running: it is not stale.
		return err
	}
	defer c.releaser("lock of attachment "+rec.Key.String(), unlockAtt)()
	if _, err := c.store.Get(rec.Key); err != nil {
		return nil // a DEL removed it since GC listed the records
	}
	unlock, err := c.lockDevice(rec.Device)
	if err != nil {
		return err
	}
	defer unlock()
	if err := c.release(rec, rec.Netns); err != nil {
		return err
	}
	c.clearQoS(rec)
	if err := c.store.Delete(rec.Key); err != nil {
		return err
	}
	c.log.Infof("GC: removed stale attachment %s (device %s)", rec.Key, rec.Device)
	return nil
}
