// Package nssysfs shows sysfs as a given network namespace sees it.
//
// sysfs filters class/infiniband and class/net by the netns that was
// current when it was mounted, so the node's /sys shows only the host's
// RDMA devices and netdevs. The doctor, the exporter and the NRI plugin
// read a pod's devices (ports, GIDs, character devices) through In, which
// mounts a fresh sysfs from inside the pod's netns on a throw-away thread;
// the exporter, which reads the same namespaces on every scrape, keeps a
// detached sysfs per netns instead (Views).
package nssysfs

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// In runs fn on a new OS thread that has its own mount namespace,
// has joined the netns at nsPath and has a sysfs mounted there on /sys.
// The thread is never unlocked, so the Go runtime ends it together with
// its namespaces when fn returns. Needs CAP_SYS_ADMIN.
func In(nsPath string, fn func(root string) error) error {
	return onThreadIn(nsPath, func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("private mount namespace: %w", err)
		}
		// Keep our mounts from propagating back to the host.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("private mount namespace: %w", err)
		}
		if err := unix.Mount("sysfs", "/sys", "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return fmt.Errorf("mount sysfs for netns %s: %w", nsPath, err)
		}
		return fn("/sys")
	})
}
