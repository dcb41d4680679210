// Package podns runs a function on an OS thread inside a network namespace
// (a pod's), optionally in a private mount namespace with that netns's
// sysfs.
//
// A namespace belongs to a thread, not to the process, and Go moves
// goroutines between threads. The rules every caller gets here:
//
//   - fn runs with its goroutine locked to the thread (runtime.LockOSThread)
//     for its whole run. fn must not unlock it, and a goroutine fn starts
//     runs on some other thread, in whatever netns that thread is in.
//   - A thread is unlocked only once it is back in the netns it came from.
//     A thread that cannot go back, or that changed what cannot be undone
//     (a private mount namespace, see Sysfs), stays locked, so the Go
//     runtime ends it with its goroutine and nothing else ever runs on it.
//   - A new thread is never the process's main thread: the main thread's
//     namespaces are the process's own in /proc/self/ns, which other code
//     reads as "our netns" meanwhile (the CNI plugin's check that a pod is
//     not in the plugin's own netns), and a main thread left locked is not
//     ended but parked for the rest of the process, still in the pod.
//   - CallerThread is the exception: it runs fn on the calling goroutine's
//     thread, whichever it is, and starts no goroutine. That is for the CNI
//     plugin, one goroutine doing one thing at a time, where a new thread
//     costs more than the visit. There a thread that cannot go back stops
//     the process, as everything after it would talk to the pod's netns.
package podns

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Thread is what fn learns about the thread it runs on.
type Thread struct {
	// From is the netns the thread came from, open while fn runs: where a
	// device goes back to.
	From netns.NsHandle
	// Sysfs is the root of a sysfs mounted from inside the netns, with
	// Sysfs or WritableSysfs; "" without.
	Sysfs string
}

// An Option picks the thread fn runs on and what it has there.
type Option func(*options)

type options struct {
	callerThread bool
	discard      bool
	sysfs        sysfsMode
}

type sysfsMode int

const (
	noSysfs sysfsMode = iota
	readOnlySysfs
	writableSysfs
)

// CallerThread runs fn on the calling goroutine's own thread instead of a
// new one, and starts no goroutine. In a freshly started process a new
// goroutine also means a new thread: measured in the test VM, the CNI
// plugin's first visit took 2.4 ms on one (as pkg/ns's Do runs it) against
// 1.0 ms on the caller's, once per ADD and DEL. A thread that cannot go
// back panics. It cannot be combined with Discard or a sysfs.
func CallerThread() Option { return func(o *options) { o.callerThread = true } }

// Discard throws the thread away after fn instead of bringing it back, for
// fn that changes the thread in ways that are not undone.
func Discard() Option { return func(o *options) { o.discard = true } }

// Sysfs gives fn (Thread.Sysfs) a read-only sysfs mounted from inside the
// netns: sysfs shows the RDMA devices and netdevs of the netns it was
// mounted in, so the host's /sys cannot reach a device that moved into a
// pod. The mount is on /sys in a private mount namespace of the thread,
// which is thrown away afterwards (Discard). Needs CAP_SYS_ADMIN.
func Sysfs() Option {
	return func(o *options) { o.sysfs, o.discard = readOnlySysfs, true }
}

// WritableSysfs is Sysfs for fn that writes to it (a driver's settings).
func WritableSysfs() Option {
	return func(o *options) { o.sysfs, o.discard = writableSysfs, true }
}

// Do runs fn on a locked OS thread that has joined the netns at nsPath: by
// default a new thread, which goes back to its own netns afterwards (or is
// thrown away when it cannot). It returns fn's error, or why the thread
// could not get there.
func Do(nsPath string, fn func(Thread) error, opts ...Option) error {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if o.callerThread {
		if o.discard {
			return errors.New("podns: the caller's thread cannot be thrown away")
		}
		return onCallerThread(nsPath, fn)
	}
	return onNewThread(nsPath, fn, o)
}

func onCallerThread(nsPath string, fn func(Thread) error) error {
	runtime.LockOSThread()
	from, err := enter(nsPath)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer from.Close()
	ferr := fn(Thread{From: from})
	if err := netns.Set(from); err != nil {
		panic(fmt.Sprintf("rdma-netns: cannot return from netns %s to its own netns: %v", nsPath, err))
	}
	runtime.UnlockOSThread()
	return ferr
}

func onNewThread(nsPath string, fn func(Thread) error, o options) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread: held meanwhile, so that the goroutine
			// started next runs on another thread; it never left.
			errc <- onNewThread(nsPath, fn, o)
			runtime.UnlockOSThread()
			return
		}
		back, err := run(nsPath, fn, o)
		if back {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// run runs fn on the calling thread, locked and not the main one, in the
// netns at nsPath. back reports whether the thread is in its own netns and
// mount namespace again, and may be unlocked.
func run(nsPath string, fn func(Thread) error, o options) (back bool, err error) {
	from, err := enter(nsPath)
	if err != nil {
		return true, err
	}
	defer from.Close()
	t := Thread{From: from}
	if o.sysfs != noSysfs {
		if err := mountSysfs(nsPath, o.sysfs == writableSysfs); err != nil {
			return false, err
		}
		t.Sysfs = "/sys"
	}
	err = fn(t)
	if o.discard {
		return false, err
	}
	return netns.Set(from) == nil, err
}

// enter moves the calling thread, locked, into the netns at nsPath and
// returns the netns it was in. On an error the thread has not moved.
//
// The handles are the netns package's bare descriptors. pkg/ns's, an
// os.File each behind a statfs check, made a visit on the caller's thread
// cost twice as much: a Go benchmark of a visit to a netns with one veth,
// on the 2-core host under load, took 84 us against 39 us (medians of 5).
func enter(nsPath string) (from netns.NsHandle, err error) {
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return -1, fmt.Errorf("failed to open netns %s: %w", nsPath, err)
	}
	defer target.Close()
	from, err = netns.Get()
	if err != nil {
		return -1, fmt.Errorf("failed to open the current netns: %w", err)
	}
	if err := netns.Set(target); err != nil {
		from.Close()
		return -1, fmt.Errorf("failed to enter netns %s: %w", nsPath, err)
	}
	return from, nil
}

// mountSysfs gives the calling thread a private mount namespace with a
// sysfs of its netns on /sys.
func mountSysfs(nsPath string, writable bool) error {
	if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("private mount namespace: %w", err)
	}
	// Keep the mount from propagating back to the host.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mount namespace: %w", err)
	}
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := unix.Mount("sysfs", "/sys", "sysfs", flags, ""); err != nil {
		return fmt.Errorf("mount sysfs for netns %s: %w", nsPath, err)
	}
	if writable {
		return nil
	}
	// Read-only on the mount, not on the superblock: every sysfs mount of
	// a netns shares one superblock, and one mounted read-only makes the
	// others read-only too while it lasts, so a reader (the doctor) would
	// fail a concurrent writer (the CNI plugin setting a traffic class).
	if err := unix.Mount("", "/sys", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|flags, ""); err != nil {
		return fmt.Errorf("make the sysfs of netns %s read-only: %w", nsPath, err)
	}
	return nil
}
