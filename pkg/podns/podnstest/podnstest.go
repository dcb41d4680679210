// Package podnstest makes network namespaces appear at chosen paths, for
// tests of what happens when a path is reused by another netns (a runtime
// reusing a name, the kernel reusing a PID in /proc/PID/ns/net).
package podnstest

import (
	"os"
	"path/filepath"
	"testing"

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

// Netdevs lists the netdevs of a sysfs (class/net under root): a sysfs
// shows those of the netns it was mounted in.
func Netdevs(t testing.TB, root string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(root, "class/net"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
