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
	valid := map[state.Key]bool{}
	for _, a := range c.conf.ValidAttachments {
		valid[state.Key{Network: c.conf.Name, ContainerID: a.ContainerID, IfName: a.IfName}] = true
	}
	unlock, err := c.openStore()
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
		if err := c.release(rec, rec.Netns); err != nil {
			errs = append(errs, fmt.Errorf("%s: %v", rec.Key, err))
			continue
		}
		c.clearQoS(rec)
		if err := c.store.Delete(rec.Key); err != nil {
			errs = append(errs, err)
			continue
		}
		c.log.Infof("GC: removed stale attachment %s (device %s)", rec.Key, rec.Device)
	}
	return errors.Join(errs...)
}
