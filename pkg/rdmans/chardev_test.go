package rdmans

import (
	"encoding/binary"
	"testing"

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
	p = append(p, newAttr(rdmaNldevAttrChardevAbi, binary.NativeEndian.AppendUint64(nil, 1))...)
	p = append(p, newAttr(rdmaNldevAttrPad, nil)...)
	p = append(p, newAttr(rdmaNldevAttrChardev, binary.NativeEndian.AppendUint64(nil, newEncodeDev(major, minor)))...)
	p = append(p, newAttr(rdmaNldevAttrChardevName, append([]byte(name), 0))...)
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
	if got := parseChardev(newAttr(rdmaNldevAttrChardevName, []byte("uverbs0\x00"))); got != nil {
		t.Errorf("an answer without a dev_t parsed as %+v", got)
	}
	// The answer to one request, as answer() hands it on.
	typ := rdmaType(rdmaNldevCmdGetChardev)
	read := append(message(typ, 0, 3, chardevAnswer("uverbs2", 231, 194)), message(unix.NLMSG_ERROR, 0, 3, errnoPayload(0))...)
	var got *CharDev
	if done, err := answer(read, 3, func(_ uint16, data []byte) { got = parseChardev(data) }); !done || err != nil || got == nil || got.Minor != 194 {
		t.Fatalf("answer: done %v err %v dev %+v", done, err, got)
	}
	// The kernel without the client (no rdma_ucm) answers EOPNOTSUPP.
	_, err := answer(message(unix.NLMSG_ERROR, 0, 4, errnoPayload(-int32(unix.EOPNOTSUPP))), 4, func(uint16, []byte) {})
	if !noChardev(err) {
		t.Fatalf("EOPNOTSUPP is %v, not 'no such node'", err)
	}
}
