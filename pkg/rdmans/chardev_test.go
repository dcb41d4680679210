package rdmans

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The attributes around the dev_t in the kernel's answer.
const (
	rdmaNldevAttrPad        = 0 // RDMA_NLDEV_ATTR_PAD, aligns 64-bit values
	rdmaNldevAttrChardevAbi = 71
)

// newEncodeDev is the kernel's huge_encode_dev for 32-bit numbers.
func newEncodeDev(major, minor uint32) uint64 {
	return uint64(minor&0xff | major<<8 | (minor&^0xff)<<12)
}

// A GET_CHARDEV answer as the kernel sends it: the dev_t after a pad
// attribute that aligns it, between the ABI and the name.
func chardevAnswer(name string, major, minor uint32) []byte {
	var p []byte
	p = append(p, nl.NewRtAttr(rdmaNldevAttrChardevAbi, binary.NativeEndian.AppendUint64(nil, 1)).Serialize()...)
	p = append(p, nl.NewRtAttr(rdmaNldevAttrPad, nil).Serialize()...)
	p = append(p, nl.NewRtAttr(rdmaNldevAttrChardev, binary.NativeEndian.AppendUint64(nil, newEncodeDev(major, minor))).Serialize()...)
	p = append(p, nl.NewRtAttr(rdmaNldevAttrChardevName, nl.ZeroTerminated(name)).Serialize()...)
	return p
}

func TestParseChardev(t *testing.T) {
	for _, want := range []CharDev{{"uverbs0", 231, 192}, {"rdma_cm", 10, 122}, {"uverbs300", 511, 1 << 12}} {
		got := parseChardev(chardevAnswer(want.Name, want.Major, want.Minor))
		if got == nil || *got != want {
			t.Errorf("parsed %+v, want %+v", got, want)
		}
		if p := want.Path(); p != "/dev/infiniband/"+want.Name {
			t.Errorf("path %s", p)
		}
	}
	if got := parseChardev(nl.NewRtAttr(rdmaNldevAttrChardevName, nl.ZeroTerminated("uverbs0")).Serialize()); got != nil {
		t.Errorf("an answer without a dev_t parsed as %+v", got)
	}
	if got := parseChardev([]byte{1, 2}); got != nil {
		t.Errorf("a truncated answer parsed as %+v", got)
	}
}

// A kernel without the client (no rdma_ucm) answers EOPNOTSUPP, a device
// without a node ENODEV or ENOENT: each is "no such node", not a failure;
// anything else is one.
func TestNoChardev(t *testing.T) {
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENODEV, unix.ENOENT, fmt.Errorf("wrapped: %w", unix.EOPNOTSUPP)} {
		if !noChardev(e) {
			t.Errorf("%v is not 'no such node'", e)
		}
	}
	for _, e := range []error{unix.EPERM, unix.EINVAL, ErrNoRDMA} {
		if noChardev(e) {
			t.Errorf("%v taken for 'no such node'", e)
		}
	}
}
