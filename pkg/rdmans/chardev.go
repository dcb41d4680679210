package rdmans

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

// RDMA_NLDEV_CMD_GET_CHARDEV and its attributes, which the netlink package
// does not name. libibverbs asks the same question to find the uverbs node
// of a device: the kernel answers for a device of the socket's netns only,
// with the node's name and dev_t.
const (
	rdmaNldevCmdGetChardev   = 15
	rdmaNldevAttrChardevType = 69
	rdmaNldevAttrChardevName = 70
	rdmaNldevAttrChardev     = 72
)

// CharDev is a character device of the RDMA subsystem, as the kernel
// registered it: its name under /dev/infiniband and its numbers.
type CharDev struct {
	Name         string
	Major, Minor uint32
}

// Path is where the node's udev (and a container's /dev) puts it.
func (c CharDev) Path() string { return "/dev/infiniband/" + c.Name }

// VerbsNode is one RDMA device of a netns and the uverbs node a verbs
// application opens to use it; Uverbs is nil when the kernel has none for
// it (ib_uverbs not loaded).
type VerbsNode struct {
	Device string
	Uverbs *CharDev
}

// VerbsNodes are the character devices a verbs application in one netns
// needs: the uverbs node of each RDMA device there, and rdma_cm (nil when
// the kernel has no rdma_ucm).
type VerbsNodes struct {
	Devices []VerbsNode
	RdmaCM  *CharDev
}

// VerbsNodesIn asks the kernel, from inside the netns at nsPath, for its
// RDMA devices and their uverbs nodes. /sys/class/infiniband_verbs is not
// filtered by netns and names devices only by their (possibly renamed,
// possibly repeated across pods) name, so the pairing comes from the
// device itself: the kernel looks the device index up in the socket's
// netns.
func (Netlink) VerbsNodesIn(nsPath string) (*VerbsNodes, error) {
	out := &VerbsNodes{}
	err := podns.Do(nsPath, func(podns.Thread) error {
		devs, err := Links()
		if err != nil {
			return fmt.Errorf("cannot list the RDMA devices in netns %s: %v", nsPath, err)
		}
		for _, d := range devs {
			idx := d.Attrs.Index
			cd, err := chardev(&idx, "uverbs")
			if err != nil && !noChardev(err) {
				return fmt.Errorf("cannot find the uverbs node of RDMA device %s in netns %s: %v", d.Attrs.Name, nsPath, err)
			}
			out.Devices = append(out.Devices, VerbsNode{Device: d.Attrs.Name, Uverbs: cd})
		}
		if len(devs) == 0 {
			return nil
		}
		cm, err := chardev(nil, "rdma_cm")
		if err != nil && !noChardev(err) {
			return fmt.Errorf("cannot find the rdma_cm node: %v", err)
		}
		out.RdmaCM = cm
		return nil
	}, podns.CallerThread())
	if err != nil {
		return nil, err
	}
	return out, nil
}

// noChardev: the kernel has no such client (module not loaded and not
// loadable), or the device has no node of that type.
func noChardev(err error) bool {
	return errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV)
}

// chardev asks the calling thread's netns for the node of type typ
// ("uverbs", "rdma_cm") of the device with index, or for the node-wide one
// when index is nil. nil, nil: the answer named none.
func chardev(index *uint32, typ string) (*CharDev, error) {
	req := nldevRequest(rdmaNldevCmdGetChardev, unix.NLM_F_ACK)
	if index != nil {
		req.AddData(nl.NewRtAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, nl.Uint32Attr(*index)))
	}
	req.AddData(nl.NewRtAttr(rdmaNldevAttrChardevType, nl.ZeroTerminated(typ)))
	msgs, err := req.Execute(unix.NETLINK_RDMA, 0)
	if err != nil {
		return nil, classify(err)
	}
	for _, m := range msgs {
		if cd := parseChardev(m); cd != nil {
			return cd, nil
		}
	}
	return nil, nil
}

// parseChardev reads one GET_CHARDEV answer; nil if it carries no dev_t.
// The kernel sends the dev_t in its 32-bit encoding (huge_encode_dev),
// which unix.Major and unix.Minor decode.
func parseChardev(data []byte) *CharDev {
	attrs, err := nl.ParseRouteAttr(data)
	if err != nil {
		return nil
	}
	var out CharDev
	found := false
	for _, a := range attrs {
		switch a.Attr.Type {
		case rdmaNldevAttrChardev:
			if len(a.Value) < 8 {
				return nil
			}
			dev := binary.NativeEndian.Uint64(a.Value)
			out.Major, out.Minor = unix.Major(dev), unix.Minor(dev)
			found = true
		case rdmaNldevAttrChardevName:
			out.Name = strings.TrimRight(string(a.Value), "\x00")
		}
	}
	if !found {
		return nil
	}
	return &out
}
