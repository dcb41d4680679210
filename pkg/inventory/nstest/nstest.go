// Package nstest makes network namespaces appear at chosen paths, for
// tests of what happens when a path is reused by another netns (a runtime
// reusing a name, the kernel reusing a PID in /proc/PID/ns/net).
package nstest

import (
	"os"
	"runtime"
	"strconv"

	"golang.org/x/sys/unix"
)

// MountNew bind-mounts a fresh network namespace at path, creating the
// file. Unmount it with unix.Unmount(path, unix.MNT_DETACH).
func MountNew(path string) error {
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() {
		// Left locked: the thread is in the new netns and must die with
		// the goroutine instead of running anything else.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount("/proc/self/task/"+strconv.Itoa(unix.Gettid())+"/ns/net", path, "none", unix.MS_BIND, "")
	}()
	return <-errc
}
