package rdmans

import (
	"fmt"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

// rdmaNldevCmdPortGet is RDMA_NLDEV_CMD_PORT_GET, which the netlink
// package does not name. The kernel answers a dump of it per device (the
// device index is mandatory) with one message per port.
const rdmaNldevCmdPortGet = 5

// nldevRequest is a request of the RDMA netlink NLDEV client, whose
// commands the netlink package builds only for the few it wraps.
func nldevRequest(cmd, flags int) *nl.NetlinkRequest {
	return nl.NewNetlinkRequest(nl.RDMA_NL_NLDEV<<nl.RDMA_NL_GET_CLIENT_SHIFT|cmd, flags)
}

// DeviceOfNetdev returns the RDMA device, in the netns at nsPath, one of
// whose ports is bound to the netdev ifName there ("" if none). This is
// how the kernel itself pairs them (`rdma link` shows it as "netdev"), so
// it finds a pod's device without any record of what was moved.
func (Netlink) DeviceOfNetdev(nsPath, ifName string) (string, error) {
	var dev string
	err := podns.Do(nsPath, func(podns.Thread) error {
		links, err := Links()
		if err != nil {
			return err
		}
		for _, l := range links {
			ports, err := Ports(l.Attrs.Index)
			if err != nil {
				return fmt.Errorf("cannot read the ports of RDMA device %s: %v", l.Attrs.Name, err)
			}
			for _, p := range ports {
				if p.Netdev == ifName {
					dev = l.Attrs.Name
					return nil
				}
			}
		}
		return nil
	}, podns.CallerThread())
	return dev, err
}

// PortInfo is one port of an RDMA device as RDMA netlink reports it.
type PortInfo struct {
	Port uint32
	// State and PhysState are the kernel's numbers (4 ACTIVE; 5 LinkUp).
	State, PhysState uint8
	// Netdev is the netdev bound to the port, "" if none or if it is in
	// another netns than the calling thread.
	Netdev string
}

// Ports lists the ports of the device with index, as seen from the calling
// thread's netns: the kernel pairs port and netdev itself, with or without
// GIDs (a port whose netdev is down has none).
func Ports(index uint32) ([]PortInfo, error) {
	req := nldevRequest(rdmaNldevCmdPortGet, unix.NLM_F_ACK|unix.NLM_F_DUMP)
	req.AddData(nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, nl.Uint32Attr(index)))
	msgs, err := req.Execute(unix.NETLINK_RDMA, 0)
	if err != nil {
		return nil, classify(err)
	}
	out := make([]PortInfo, 0, len(msgs))
	for _, m := range msgs {
		if p := parsePort(m); p.Port > 0 {
			out = append(out, p)
		}
	}
	return out, nil
}

// parsePort reads one PORT_GET answer; Port 0 means it named no port.
func parsePort(msg []byte) PortInfo {
	var p PortInfo
	attrs, err := nl.ParseRouteAttr(msg)
	if err != nil {
		return p
	}
	for _, a := range attrs {
		switch v := a.Value; a.Attr.Type {
		case nl.RDMA_NLDEV_ATTR_PORT_INDEX:
			if len(v) >= 4 {
				p.Port = nl.NativeEndian().Uint32(v)
			}
		case nl.RDMA_NLDEV_ATTR_PORT_STATE:
			if len(v) >= 1 {
				p.State = v[0]
			}
		case nl.RDMA_NLDEV_ATTR_PORT_PHYS_STATE:
			if len(v) >= 1 {
				p.PhysState = v[0]
			}
		case nl.RDMA_NLDEV_ATTR_NDEV_NAME:
			p.Netdev = strings.TrimRight(string(v), "\x00")
		}
	}
	return p
}
