package rdmans

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// message builds one netlink message as the kernel sends it.
func message(typ, flags uint16, seq uint32, payload []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(payload)+3)
	binary.NativeEndian.PutUint32(b[0:], uint32(unix.NLMSG_HDRLEN+len(payload)))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], seq)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func errnoPayload(errno int32) []byte {
	return binary.NativeEndian.AppendUint32(nil, uint32(errno))
}

// rdmaDev is an RDMA_NLDEV_CMD_GET answer with the attributes the kernel
// puts around index and name.
func rdmaDev(index uint32, name string) []byte {
	var p []byte
	p = append(p, newAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, u32(index))...)
	p = append(p, newAttr(nl.RDMA_NLDEV_ATTR_DEV_NAME, append([]byte(name), 0))...)
	p = append(p, newAttr(nl.RDMA_NLDEV_ATTR_FW_VERSION, []byte("1.0.0\x00"))...)
	p = append(p, newAttr(nl.RDMA_NLDEV_ATTR_NODE_GUID, make([]byte, 8))...)
	return p
}

// A dump's answer is read across several reads, in any batching, and only
// the messages of this request count.
func TestAnswerDump(t *testing.T) {
	get := rdmaType(nl.RDMA_NLDEV_CMD_GET)
	reads := [][]byte{
		append(message(get, unix.NLM_F_MULTI, 6, rdmaDev(9, "stale0")), message(get, unix.NLM_F_MULTI, 7, rdmaDev(1, "mlx5_0"))...),
		append(message(get, unix.NLM_F_MULTI, 7, rdmaDev(4, "irdma1")), message(unix.NLMSG_DONE, unix.NLM_F_MULTI, 7, errnoPayload(0))...),
	}
	var devs []device
	for i, r := range reads {
		done, err := answer(r, 7, func(_ uint16, data []byte) { devs = append(devs, parseDevice(data)) })
		if err != nil || done != (i == len(reads)-1) {
			t.Fatalf("read %d: done %v, err %v", i, done, err)
		}
	}
	if len(devs) != 2 || devs[0] != (device{1, "mlx5_0"}) || devs[1] != (device{4, "irdma1"}) {
		t.Fatalf("devices %+v", devs)
	}
}

func TestAnswerErrors(t *testing.T) {
	nothing := func(uint16, []byte) { t.Error("no message expected") }
	done, err := answer(message(unix.NLMSG_ERROR, 0, 3, errnoPayload(-int32(unix.ENODEV))), 3, nothing)
	if !done || !errors.Is(err, unix.ENODEV) {
		t.Errorf("error answer: done %v, err %v", done, err)
	}
	done, err = answer(message(unix.NLMSG_ERROR, 0, 3, errnoPayload(0)), 3, nothing)
	if !done || err != nil {
		t.Errorf("acknowledgement: done %v, err %v", done, err)
	}
	done, err = answer(message(unix.NLMSG_DONE, unix.NLM_F_MULTI|unix.NLM_F_DUMP_INTR, 3, errnoPayload(0)), 3, nothing)
	if !done || !errors.Is(err, errDumpInterrupted) {
		t.Errorf("interrupted dump: done %v, err %v", done, err)
	}
	if done, err = answer([]byte{1, 2, 3}, 3, nothing); !done || err == nil {
		t.Errorf("garbage: done %v, err %v", done, err)
	}
	// An earlier request's error says nothing about this one.
	done, err = answer(message(unix.NLMSG_ERROR, 0, 2, errnoPayload(-int32(unix.EPERM))), 3, nothing)
	if done || err != nil {
		t.Errorf("stale error: done %v, err %v", done, err)
	}
}

// Requests go out as the kernel parses them: one attribute list, aligned.
func TestNewAttr(t *testing.T) {
	b := append(newAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, u32(5)), newAttr(nl.RDMA_NLDEV_ATTR_DEV_NAME, []byte("rxe0\x00"))...)
	if len(b) != 8+12 {
		t.Fatalf("attributes are %d bytes, want 20 (name padded to 4)", len(b))
	}
	if d := parseDevice(b); d != (device{5, "rxe0"}) {
		t.Fatalf("parsed back %+v", d)
	}
}
