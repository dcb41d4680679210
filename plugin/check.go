package plugin

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// Check verifies that the attachment still holds: its device is in the pod,
// the subsystem is still exclusive, and prevResult still has the netdev.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	c, err := p.newCall(args, true)
	if err != nil {
		return err
	}
	if err := c.check(); err != nil {
		c.log.Errorf("CHECK failed: %v", err)
		return err
	}
	return nil
}

func (c *call) check() error {
	if c.conf.Claims {
		// The claims' NICs are checked by their own attachments' records
		// (the doctor reads them); the primary network's CHECK is its
		// plugin's.
		return nil
	}
	if c.conf.Result == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs a prevResult", "")
	}
	if err := c.key().ValidateRuntime(); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, err.Error(), "")
	}
	for _, refuse := range []func() error{c.nadLogFile, c.nadStateDir} {
		if err := refuse(); err != nil {
			c.log.Warnf("%v", err)
		}
	}
	if c.conf.DRA != nil {
		if err := c.nadRecordDir(); err != nil {
			// Said, not failed: ADD refuses the network now, and the
			// attachment being checked is held to the kernel as any is.
			c.log.Warnf("%v", err)
		}
	}
	if err := state.ValidateIfName(c.args.IfName); err != nil {
		// ADD refused the pod's name and attached nothing: nothing to check.
		c.log.Infof("nothing to check: ADD refuses this interface name (%v)", err)
		return nil
	}
	if err := c.exclusive(); err != nil {
		if c.conf.AllowSharedMode {
			return nil
		}
		return err
	}
	if _, err := podNetdev(c.conf.Result, c.args.IfName); err != nil {
		return err
	}
	st, err := state.New(c.p.stateDir())
	if err != nil {
		return err
	}
	rec, err := st.Get(c.key())
	if errors.Is(err, state.ErrNotFound) {
		if perr := state.ValidatePlainIfName(c.args.IfName); perr != nil {
			// ADD refused the name and attached nothing; a record an
			// older ADD wrote under it is checked like any other.
			c.log.Infof("nothing to check: ADD refuses this interface name (%v)", perr)
			return nil
		}
		return fmt.Errorf("no RDMA device is recorded for %s: ADD did not run or did not finish", c.key())
	}
	if err != nil {
		return err
	}
	if rec.Netns != c.args.Netns {
		return fmt.Errorf("RDMA device %s was attached to netns %s, not %s", rec.InPod(), rec.Netns, c.args.Netns)
	}
	if rec.State != state.StateAttached {
		return fmt.Errorf("the attachment of RDMA device %s did not finish (state %q); retry ADD or run DEL", rec.InPod(), rec.State)
	}
	in, err := c.p.Kernel.InNetns(c.args.Netns, rec.InPod())
	if err != nil {
		return fmt.Errorf("cannot look for RDMA device %s in netns %s: %v", rec.InPod(), c.args.Netns, err)
	}
	if !in {
		return fmt.Errorf("RDMA device %s is no longer in the pod's netns %s: something moved or removed it", rec.InPod(), c.args.Netns)
	}
	if q := c.qos(); q != nil {
		if err := c.p.Kernel.VerifyQoS(c.args.Netns, rec.InPod(), *q); err != nil {
			return fmt.Errorf("rdmaQoS no longer holds: %v", err)
		}
	}
	return nil
}
