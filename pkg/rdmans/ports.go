package rdmans

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
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
	err := visit(nsPath, func(netns.NsHandle) error {
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
	})
	return dev, err
}

// attrString finds one string attribute in an RDMA netlink message, whose
// payload is a flat list of attributes.
func attrString(msg []byte, want uint16) string {
	return strings.TrimRight(string(attr(msg, want)), "\x00")
}

// attr finds the payload of one attribute, nil if absent.
func attr(msg []byte, want uint16) []byte {
	for len(msg) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(msg[0:2]))
		typ := binary.NativeEndian.Uint16(msg[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
		if l < unix.SizeofNlAttr || l > len(msg) {
			return nil
		}
		if typ == want {
			return msg[unix.SizeofNlAttr:l]
		}
		next := (l + unix.NLA_ALIGNTO - 1) &^ (unix.NLA_ALIGNTO - 1)
		if next > len(msg) {
			return nil
		}
		msg = msg[next:]
	}
	return nil
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
	proto := int(rdmaType(rdmaNldevCmdPortGet))
	req := nl.NewNetlinkRequest(proto, unix.NLM_F_ACK|unix.NLM_F_DUMP)
	b := make([]byte, 4)
	nl.NativeEndian().PutUint32(b, index)
	req.AddData(nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, b))
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
	p := PortInfo{Netdev: attrString(msg, rdmaNldevAttrNdevName)}
	if v := attr(msg, nl.RDMA_NLDEV_ATTR_PORT_INDEX); len(v) >= 4 {
		p.Port = binary.NativeEndian.Uint32(v)
	}
	if v := attr(msg, nl.RDMA_NLDEV_ATTR_PORT_STATE); len(v) >= 1 {
		p.State = v[0]
	}
	if v := attr(msg, nl.RDMA_NLDEV_ATTR_PORT_PHYS_STATE); len(v) >= 1 {
		p.PhysState = v[0]
	}
	return p
}
