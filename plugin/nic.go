package plugin

import (
	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// podLink is the pod's netdev as one read found it.
type podLink struct {
	name string
	nd   rdmans.Netdev
	err  error
}

// netdev reads the pod's netdev ifName once per call: resolution asks for
// the device behind it, the record for that and its alias.
func (c *call) netdev(ifName string) (rdmans.Netdev, error) {
	if c.podLink == nil || c.podLink.name != ifName {
		nd, err := c.p.Kernel.Netdev(c.args.Netns, ifName)
		c.podLink = &podLink{name: ifName, nd: nd, err: err}
	}
	return c.podLink.nd, c.podLink.err
}

// hostNetdev is the name the attachment's NIC has in the host, which DEL
// gives back to the pod's link as its alias before host-device's DEL
// renames the link to its alias, and the device behind the NIC, by which
// DEL finds the link whatever the pod named it; "" when ADD cannot tell.
//
// The name is the alias of CNI_IFNAME as ADD finds it. host-device set it
// to the NIC's host name as it moved the NIC in, just before: in a chain
// it runs before rdma-netns, in dra mode rdma-netns ran it in this call.
// No container of the pod has run yet (the runtime sets a sandbox's
// network up before it starts them), and only they could have changed
// it: it is the name the NIC had in the host a moment ago. In dra mode
// the driver's record names the NIC's netdev too, but as it was at
// Prepare, which the record outlives (a reboot, a udev rename): a name
// restored on DEL that another NIC has taken since would strand the NIC
// in the pod, as a pod-set alias does. So the record is the cross-check,
// and stands in only where the alias is not a plain interface name.
func (c *call) hostNetdev() (name, parent string) {
	nd, err := c.netdev(c.args.IfName)
	if err != nil {
		c.log.Debugf("no host name of the NIC recorded: %v", err)
		return "", ""
	}
	if state.ValidatePlainIfName(nd.Alias) == nil {
		name = nd.Alias
	}
	if d := c.claimed; d != nil && d.Netdev != "" && d.Netdev != name {
		switch {
		case name != "":
			c.log.Warnf("host-device moved in NIC %s from the host's netdev %s, but the DRA driver recorded %s at Prepare (renamed since?): DEL gives it back %s",
				d.PCIAddress, config.Quote(name), config.Quote(d.Netdev), config.Quote(name))
		case state.ValidatePlainIfName(d.Netdev) == nil:
			c.log.Infof("netdev %s in the pod has no alias that names a host netdev (%s): DEL gives NIC %s back the name the DRA driver recorded, %s",
				c.args.IfName, config.Quote(nd.Alias), d.PCIAddress, config.Quote(d.Netdev))
			name = d.Netdev
		}
	}
	if name == "" {
		c.log.Debugf("netdev %s in the pod has no alias that names a host netdev (%s): no host name of the NIC recorded", c.args.IfName, config.Quote(nd.Alias))
		return "", ""
	}
	return name, nd.ParentID()
}

// nicOf is what DEL gives back to rec's NIC for host-device's DEL. A
// record without the NIC's host name asks for nothing.
func (c *call) nicOf(rec *state.Record) rdmans.NIC {
	if rec.HostNetdev == "" {
		c.log.Debugf("the record holds no host name of the NIC (an older rdma-netns wrote it, or the netdev had no alias at ADD): the link is left as the pod left it")
		return rdmans.NIC{}
	}
	return rdmans.NIC{Parent: rec.NetdevParent, IfName: rec.Key.IfName, HostName: rec.HostNetdev}
}

// logNICFix says what DEL gave back to the NIC; what the pod had set is
// quoted.
func (c *call) logNICFix(nic rdmans.NIC, fix rdmans.NICFix) {
	switch {
	case nic.HostName == "":
		return
	case !fix.Found:
		c.log.Infof("NIC %s (%s in the host) is not in the pod (taken out already, or gone): nothing to give back", nic.IfName, nic.HostName)
		return
	}
	if fix.Aside != "" {
		c.log.Warnf("the pod's link %s is not its NIC (the link behind %s): renamed it %s, out of host-device's way", nic.IfName, nic.Parent, fix.Aside)
	}
	if fix.Name != "" {
		c.log.Warnf("the pod had renamed its NIC %s (%s in the host): renamed it back from %s", nic.IfName, nic.HostName, config.Quote(fix.Name))
	}
	if fix.Realiased {
		c.log.Warnf("the pod had set the alias of its NIC %s to %s: gave it back %s, the host name host-device returns it under", nic.IfName, config.Quote(fix.Alias), nic.HostName)
	}
	if fix == (rdmans.NICFix{Found: true}) {
		c.log.Debugf("NIC %s still carries its host name %s as alias: nothing to give back", nic.IfName, nic.HostName)
	}
}
