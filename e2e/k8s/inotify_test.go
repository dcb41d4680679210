//go:build e2e

package k8s

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirEvents collects the inotify events of one name in a directory.
type dirEvents struct {
	fd   int
	name string
}

// The events that change a directory entry or its file.
var eventNames = []struct {
	mask uint32
	name string
}{
	{unix.IN_CREATE, "IN_CREATE"}, {unix.IN_MODIFY, "IN_MODIFY"}, {unix.IN_CLOSE_WRITE, "IN_CLOSE_WRITE"},
	{unix.IN_ATTRIB, "IN_ATTRIB"}, {unix.IN_MOVED_TO, "IN_MOVED_TO"}, {unix.IN_MOVED_FROM, "IN_MOVED_FROM"},
	{unix.IN_DELETE, "IN_DELETE"},
}

func newDirEvents(dir, name string) (*dirEvents, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("inotify_init1: %v", err)
	}
	var mask uint32
	for _, e := range eventNames {
		mask |= e.mask
	}
	if _, err := unix.InotifyAddWatch(fd, dir, mask); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("inotify watch %s: %v", dir, err)
	}
	return &dirEvents{fd: fd, name: name}, nil
}

// close reads the events queued so far (the kernel keeps them until read)
// and returns those of the name, in order.
func (d *dirEvents) close() ([]string, error) {
	defer unix.Close(d.fd)
	var got []string
	buf := make([]byte, 64*1024)
	for {
		n, err := unix.Read(d.fd, buf)
		if errors.Is(err, unix.EAGAIN) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			nameBytes := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				return got, errors.New("inotify queue overflowed")
			}
			if string(trimNUL(nameBytes)) != d.name {
				continue
			}
			for _, e := range eventNames {
				if ev.Mask&e.mask != 0 {
					got = append(got, e.name)
				}
			}
		}
	}
}

func trimNUL(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
