package rdmans

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// rdmaNldevCmdPortGet is RDMA_NLDEV_CMD_PORT_GET, which the netlink
// package does not name. The kernel answers a dump of it per device (the
// device index is mandatory) with one message per port.
const (
	rdmaNldevCmdPortGet   = 5
	rdmaNldevAttrNdevName = nl.RDMA_NLDEV_ATTR_NDEV_NAME
)

// DeviceOfNetdev returns the RDMA device, in the netns at nsPath, one of
// whose ports is bound to the netdev ifName there ("" if none). This is
// how the kernel itself pairs them (`rdma link` shows it as "netdev"), so
// it finds a pod's device without any record of what was moved.
func (Netlink) DeviceOfNetdev(nsPath, ifName string) (string, error) {
	var dev string
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		links, err := list()
		if err != nil {
			return err
		}
		for _, l := range links {
			netdevs, err := portNetdevs(l.Attrs.Index)
			if err != nil {
				return fmt.Errorf("cannot read the ports of RDMA device %s: %v", l.Attrs.Name, classify(err))
			}
			for _, n := range netdevs {
				if n == ifName {
					dev = l.Attrs.Name
					return nil
				}
			}
		}
		return nil
	})
	return dev, err
}

// portNetdevs lists the netdevs the ports of device index are bound to,
// as seen from the calling thread's netns (the kernel leaves out netdevs
// of other namespaces).
func portNetdevs(index uint32) ([]string, error) {
	proto := nl.RDMA_NL_NLDEV<<nl.RDMA_NL_GET_CLIENT_SHIFT | rdmaNldevCmdPortGet
	req := nl.NewNetlinkRequest(proto, unix.NLM_F_ACK|unix.NLM_F_DUMP)
	b := make([]byte, 4)
	nl.NativeEndian().PutUint32(b, index)
	req.AddData(nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, b))
	msgs, err := req.Execute(unix.NETLINK_RDMA, 0)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range msgs {
		if name := attrString(m, rdmaNldevAttrNdevName); name != "" {
			out = append(out, name)
		}
	}
	return out, nil
}

// attrString finds one string attribute in an RDMA netlink message, whose
// payload is a flat list of attributes.
func attrString(msg []byte, want uint16) string {
	for len(msg) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(msg[0:2]))
		typ := binary.NativeEndian.Uint16(msg[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.SizeofNlAttr || l > len(msg) {
			return ""
		}
		if typ == want {
			return strings.TrimRight(string(msg[unix.SizeofNlAttr:l]), "\x00")
		}
		next := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if next > len(msg) {
			return ""
		}
		msg = msg[next:]
	}
	return ""
}
