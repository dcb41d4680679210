package nssysfs

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/podns"
)

// Views keeps one detached sysfs per network namespace from one call to
// the next, for a caller that reads the same namespaces again and again
// (the exporter, on every scrape). In mounts a sysfs and tears a mount
// namespace down on every call, most of what a pod costs a scrape.
//
// A view is a sysfs mounted, without a mount namespace, from a thread in
// the netns (fsopen/fsmount), held by its file descriptor only. It keeps
// only a passive reference on the netns, as every sysfs mount does: the
// netns still dies with its last process or bind mount and its RDMA
// devices still go home; the view then shows no device. Views are keyed by
// the netns cookie, which the kernel never gives to another netns (inode
// numbers it does reuse), so a view never shows one pod's netns in place
// of another's.
type Views struct {
	// busy is held for reading while a view is read and for writing by
	// Sweep, so no descriptor is closed (and its number reused) under a
	// reader.
	busy sync.RWMutex
	mu   sync.Mutex
	// byNetns maps a netns cookie to its view.
	byNetns map[uint64]*view
}

type view struct {
	fd   int
	used bool
}

// In runs fn on an OS thread that has joined the netns at nsPath, with
// root the netns's view of sysfs (kept for the next call). Nothing here
// changes a thread for good, so the thread goes back to its own netns and
// to the Go runtime afterwards (podns.Do without Discard): a new thread for
// every netns would cost more than the visit itself. On a kernel without
// fsopen (before 5.2), or where seccomp refuses it, it is the package's In.
func (v *Views) In(nsPath string, fn func(root string) error) error {
	v.busy.RLock()
	defer v.busy.RUnlock()
	err := podns.Do(nsPath, func(podns.Thread) error {
		fd, cached, err := v.viewHere()
		if err != nil {
			return err
		}
		if !cached {
			defer unix.Close(fd)
		}
		return fn("/proc/self/fd/" + strconv.Itoa(fd))
	})
	if errors.Is(err, errNoFsopen) {
		return In(nsPath, fn)
	}
	return err
}

// viewHere finds or mounts the view of the calling thread's netns. cached
// is false when the kernel has no netns cookies (before 5.14): the view is
// then the caller's to close.
func (v *Views) viewHere() (fd int, cached bool, err error) {
	cookie, cookieErr := netnsCookie()
	if cookieErr == nil {
		v.mu.Lock()
		defer v.mu.Unlock()
		if w := v.byNetns[cookie]; w != nil {
			w.used = true
			return w.fd, true, nil
		}
	}
	fd, err = detachedSysfs()
	if err != nil || cookieErr != nil {
		return fd, false, err
	}
	if v.byNetns == nil {
		v.byNetns = map[uint64]*view{}
	}
	v.byNetns[cookie] = &view{fd: fd, used: true}
	return fd, true, nil
}

// Sweep closes the views not used since the last Sweep: the netns of a
// pod that is gone, or one no longer read.
func (v *Views) Sweep() {
	v.busy.Lock()
	defer v.busy.Unlock()
	v.mu.Lock()
	defer v.mu.Unlock()
	for cookie, w := range v.byNetns {
		if !w.used {
			unix.Close(w.fd)
			delete(v.byNetns, cookie)
			continue
		}
		w.used = false
	}
}

// Len is the number of views kept.
func (v *Views) Len() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.byNetns)
}

// netnsCookie is the calling thread's netns cookie, through a socket
// opened there.
func netnsCookie() (uint64, error) {
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for the netns cookie: %w", err)
	}
	defer unix.Close(s)
	return unix.GetsockoptUint64(s, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
}

var errNoFsopen = errors.New("fsopen is not available")

// detachedSysfs mounts a read-only sysfs of the calling thread's netns
// without attaching it anywhere.
func detachedSysfs() (int, error) {
	fsfd, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		// A kernel before 5.2, or a seccomp profile that allows mount but
		// not the new mount calls: mount the old way.
		return -1, fmt.Errorf("%w: %v", errNoFsopen, err)
	}
	if err != nil {
		return -1, fmt.Errorf("fsopen sysfs: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("create sysfs: %w", err)
	}
	fd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount sysfs: %w", err)
	}
	return fd, nil
}
