// Package nssysfs shows sysfs as a given network namespace sees it.
//
// sysfs filters class/infiniband and class/net by the netns that was
// current when it was mounted, so the node's /sys shows only the host's
// RDMA devices and netdevs. The doctor, the exporter and the NRI plugin
// read a pod's devices (ports, GIDs, character devices) through In, which
// mounts a fresh sysfs from inside the pod's netns on a throw-away thread.
package nssysfs

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// In runs fn on a new OS thread that has its own mount namespace,
// has joined the netns at nsPath and has a sysfs mounted there on /sys.
// The thread is never unlocked, so the Go runtime ends it together with
// its namespaces when fn returns. Needs CAP_SYS_ADMIN.
func In(nsPath string, fn func(root string) error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with its mount namespace
		if unix.Gettid() == unix.Getpid() {
			// The main thread is never ended, only parked, and it is what
			// /proc/PID/ns/* of this process shows. Keep it locked here so
			// the work must land on another thread, then let it go.
			errc <- In(nsPath, fn)
			runtime.UnlockOSThread()
			return
		}
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return fmt.Errorf("private mount namespace: %w", err)
			}
			// Keep our mounts from propagating back to the host.
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return fmt.Errorf("private mount namespace: %w", err)
			}
			fd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("open netns %s: %w", nsPath, err)
			}
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("enter netns %s: %w", nsPath, err)
			}
			if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
				return fmt.Errorf("mount sysfs for netns %s: %w", nsPath, err)
			}
			return fn("/sys")
		}()
	}()
	return <-errc
}
