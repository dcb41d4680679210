package rdmans

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// conn is one blocking netlink socket in the calling thread's netns, for
// the few requests of one plugin step. The netlink package opens a socket
// per request, registers it with Go's poller, arms a deadline timer for
// every read and decodes every attribute of every RDMA device in a dump;
// on a freshly started plugin that is code run once per request, paid
// twice on every ADD and DEL (the kernel's answers here are immediate).
type conn struct {
	fd  int
	seq uint32
	buf []byte
}

// connTimeout bounds a read: the kernel answers these requests while the
// request is being sent, so only a kernel gone wrong ever hits it.
var connTimeout = unix.Timeval{Sec: 30}

func dial(proto int) (*conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return nil, classify(err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &connTimeout); err != nil {
		unix.Close(fd)
		return nil, err
	}
	// A dump part never exceeds 32 KiB (the kernel's cap for dump skbs);
	// one buffer serves every read.
	return &conn{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (c *conn) close() { unix.Close(c.fd) }

// errDumpInterrupted means the kernel's list changed while it was dumped.
var errDumpInterrupted = netlink.ErrDumpInterrupted

// request sends one request and hands each answer message's payload to fn,
// until the kernel's acknowledgement or the end of the dump.
func (c *conn) request(typ, flags uint16, payload []byte, fn func(typ uint16, data []byte)) error {
	c.seq++
	msg := make([]byte, unix.NLMSG_HDRLEN, unix.NLMSG_HDRLEN+len(payload))
	binary.NativeEndian.PutUint32(msg[0:], uint32(unix.NLMSG_HDRLEN+len(payload)))
	binary.NativeEndian.PutUint16(msg[4:], typ)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	binary.NativeEndian.PutUint32(msg[8:], c.seq)
	msg = append(msg, payload...)
	if err := unix.Sendto(c.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	for {
		n, from, err := unix.Recvfrom(c.fd, c.buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
			continue // only the kernel answers
		}
		done, err := answer(c.buf[:n], c.seq, fn)
		if done || err != nil {
			return err
		}
	}
}

// answer walks one read's worth of netlink messages. done reports the end
// of the answer (acknowledgement, error, or end of dump).
func answer(b []byte, seq uint32, fn func(typ uint16, data []byte)) (done bool, err error) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err == nil && len(msgs) == 0 {
		err = fmt.Errorf("%d bytes", len(b))
	}
	if err != nil {
		return true, fmt.Errorf("malformed netlink answer: %v", err)
	}
	intr := false
	for _, m := range msgs {
		if m.Header.Seq != seq {
			continue // an answer to an earlier request
		}
		if m.Header.Flags&unix.NLM_F_DUMP_INTR != 0 {
			intr = true
		}
		switch m.Header.Type {
		case unix.NLMSG_DONE, unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
					return true, unix.Errno(-errno)
				}
			}
			if intr {
				return true, errDumpInterrupted
			}
			return true, nil
		default:
			fn(m.Header.Type, m.Data)
		}
	}
	if intr {
		return true, errDumpInterrupted
	}
	return false, nil
}

// newAttr builds one netlink attribute.
func newAttr(typ uint16, v []byte) []byte {
	l := unix.SizeofNlAttr + len(v)
	b := make([]byte, (l+unix.NLA_ALIGNTO-1)&^(unix.NLA_ALIGNTO-1))
	binary.NativeEndian.PutUint16(b, uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[unix.SizeofNlAttr:], v)
	return b
}

func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// rdmaType is the netlink message type of an RDMA netlink device command.
func rdmaType(cmd int) uint16 { return uint16(nl.RDMA_NL_NLDEV<<nl.RDMA_NL_GET_CLIENT_SHIFT | cmd) }

// device is an RDMA device as far as moving it goes.
type device struct {
	index uint32
	name  string
}

// devices lists the RDMA devices of the socket's netns by index and name,
// retrying dumps the kernel marked as interrupted: a device moving while we
// read must not make us believe it is gone.
func (c *conn) devices() ([]device, error) {
	for i := 0; ; i++ {
		var devs []device
		err := c.request(rdmaType(nl.RDMA_NLDEV_CMD_GET), unix.NLM_F_DUMP, nil, func(_ uint16, data []byte) {
			devs = append(devs, parseDevice(data))
		})
		if errors.Is(err, errDumpInterrupted) && i < 5 {
			continue
		}
		return devs, classify(err)
	}
}

// parseDevice reads index and name from one RDMA_NLDEV_CMD_GET answer.
func parseDevice(data []byte) device {
	d := device{name: attrString(data, nl.RDMA_NLDEV_ATTR_DEV_NAME)}
	if v := attr(data, nl.RDMA_NLDEV_ATTR_DEV_INDEX); len(v) >= 4 {
		d.index = binary.NativeEndian.Uint32(v)
	}
	return d
}

// lookup finds the named device among those of the socket's netns.
func (c *conn) lookup(name string) (device, bool, error) {
	devs, err := c.devices()
	if err != nil {
		return device{}, false, err
	}
	for _, d := range devs {
		if d.name == name {
			return d, true, nil
		}
	}
	return device{}, false, nil
}

// setNetns moves the device into the netns of the open file fd.
func (c *conn) setNetns(d device, fd int) error {
	payload := append(newAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, u32(d.index)), newAttr(nl.RDMA_NLDEV_NET_NS_FD, u32(uint32(fd)))...)
	return classify(c.request(rdmaType(nl.RDMA_NLDEV_CMD_SET), 0, payload, func(uint16, []byte) {}))
}

// rename gives the device a new name.
func (c *conn) rename(d device, name string) error {
	payload := append(newAttr(nl.RDMA_NLDEV_ATTR_DEV_INDEX, u32(d.index)), newAttr(nl.RDMA_NLDEV_ATTR_DEV_NAME, append([]byte(name), 0))...)
	return classify(c.request(rdmaType(nl.RDMA_NLDEV_CMD_SET), 0, payload, func(uint16, []byte) {}))
}

// withRDMA runs fn on an RDMA netlink socket of the calling thread's netns.
func withRDMA(fn func(c *conn) error) error {
	c, err := dial(unix.NETLINK_RDMA)
	if err != nil {
		return err
	}
	defer c.close()
	return fn(c)
}
