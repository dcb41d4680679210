// Package podnstest makes network namespaces appear at chosen paths, for
// tests of what happens when a path is reused by another netns (a runtime
// reusing a name, the kernel reusing a PID in /proc/PID/ns/net).
package podnstest

import (
	"os"

	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"
)

// MountNew bind-mounts a fresh network namespace at path, creating the
// file. Unmount it with unix.Unmount(path, unix.MNT_DETACH).
func MountNew(path string) error {
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		return err
	}
	fresh, err := testutils.NewNS()
	if err != nil {
		return err
	}
	defer testutils.UnmountNS(fresh)
	defer fresh.Close()
	return unix.Mount(fresh.Path(), path, "", unix.MS_BIND, "")
}
