// Package sysfstest builds fake sysfs trees for tests. The trees use real
// directories and relative symlinks laid out the way the kernel lays them
// out, so code under test resolves them with the same calls it uses on /sys.
package sysfstest

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Tree is a fake sysfs rooted at Root. Device paths given to its methods are
// relative to <Root>/devices, e.g. "pci0000:3a/0000:3a:00.0/0000:3b:00.0".
type Tree struct {
	Root string
	tb   testing.TB
}

// New returns an empty tree in a temporary directory. Root is resolved so
// that paths the tree returns compare equal to paths obtained through
// filepath.EvalSymlinks (t.TempDir may itself sit behind a symlink).
func New(tb testing.TB) *Tree {
	tb.Helper()
	root, err := filepath.EvalSymlinks(tb.TempDir())
	if err != nil {
		tb.Fatalf("resolve temp dir: %v", err)
	}
	return &Tree{Root: root, tb: tb}
}

// Path returns the absolute path of a device directory.
func (t *Tree) Path(devPath string) string {
	return filepath.Join(t.Root, "devices", filepath.FromSlash(devPath))
}

// Device creates the device directory devPath as a member of bus: its
// `subsystem` link points to bus/<bus> and bus/<bus>/devices/<name> links
// back to it. With bus "" only the directory is created (like pci0000:3a).
// It returns the absolute path of the device.
func (t *Tree) Device(bus, devPath string) string {
	t.tb.Helper()
	dir := t.Path(devPath)
	t.mkdir(dir)
	if bus == "" {
		return dir
	}
	busDir := filepath.Join(t.Root, "bus", bus)
	t.mkdir(filepath.Join(busDir, "devices"))
	t.symlink(filepath.Join(dir, "subsystem"), busDir)
	t.symlink(filepath.Join(busDir, "devices", filepath.Base(dir)), dir)
	return dir
}

// PCI creates a PCI function (or bridge) at devPath.
func (t *Tree) PCI(devPath string) string {
	t.tb.Helper()
	return t.Device("pci", devPath)
}

// Netdev creates net/<name> under the parent device and class/net/<name>.
func (t *Tree) Netdev(parent, name string) string {
	t.tb.Helper()
	return t.classDevice("net", parent, name)
}

// RDMA creates infiniband/<name> under the parent device and
// class/infiniband/<name>, as an RDMA driver's ib_register_device does.
func (t *Tree) RDMA(parent, name string) string {
	t.tb.Helper()
	return t.classDevice("infiniband", parent, name)
}

// GID writes entry index of the GID table of port of the RDMA device name
// (made by RDMA): ports/<port>/gids/<index> as the kernel prints it, and
// the entry's netdev and type ("RoCE v2", "IB/RoCE v1") under gid_attrs.
// An empty ndev or typ leaves that attribute out.
func (t *Tree) GID(name string, port, index int, gid, typ, ndev string) {
	t.tb.Helper()
	dir := filepath.Join(t.Root, "class", "infiniband", name, "ports", strconv.Itoa(port))
	n := strconv.Itoa(index)
	t.write(filepath.Join(dir, "gids", n), gid+"\n")
	if ndev != "" {
		t.write(filepath.Join(dir, "gid_attrs", "ndevs", n), ndev+"\n")
	}
	if typ != "" {
		t.write(filepath.Join(dir, "gid_attrs", "types", n), typ+"\n")
	}
}

// IPv4GID is the GID the kernel derives from an IPv4 address (the
// IPv4-mapped ::ffff:a.b.c.d), in sysfs's notation.
func IPv4GID(addr string) string {
	a := netip.MustParseAddr(addr).As16()
	a[10], a[11] = 0xff, 0xff
	var parts []string
	for i := 0; i < 16; i += 2 {
		parts = append(parts, fmt.Sprintf("%02x%02x", a[i], a[i+1]))
	}
	return strings.Join(parts, ":")
}

func (t *Tree) write(path, data string) {
	t.tb.Helper()
	t.mkdir(filepath.Dir(path))
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.tb.Fatal(err)
	}
}

// classDevice mirrors device_add for a class device: the directory lives
// under its parent, `device` points at the parent ("../../../<parent>", as
// the kernel writes it) and the class directory holds a link to it.
func (t *Tree) classDevice(class, parent, name string) string {
	t.tb.Helper()
	parentDir := t.Path(parent)
	dir := filepath.Join(parentDir, class, name)
	t.mkdir(dir)
	t.symlink(filepath.Join(dir, "device"), parentDir)
	t.symlink(filepath.Join(dir, "subsystem"), filepath.Join(t.Root, "class", class))
	t.mkdir(filepath.Join(t.Root, "class", class))
	t.symlink(filepath.Join(t.Root, "class", class, name), dir)
	return dir
}

// Remove deletes a class device from the tree, as happens when it moves to
// another network namespace.
func (t *Tree) Remove(class, name string) {
	t.tb.Helper()
	link := filepath.Join(t.Root, "class", class, name)
	dir, err := filepath.EvalSymlinks(link)
	if err != nil {
		t.tb.Fatalf("resolve %s: %v", link, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.tb.Fatal(err)
	}
	if err := os.Remove(link); err != nil {
		t.tb.Fatal(err)
	}
}

func (t *Tree) mkdir(dir string) {
	t.tb.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.tb.Fatal(err)
	}
}

// symlink creates link pointing at target with a relative path, as sysfs
// links are relative.
func (t *Tree) symlink(link, target string) {
	t.tb.Helper()
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		t.tb.Fatal(err)
	}
	// The kernel writes a class device's `device` link as a walk up past
	// the parent and back down by name; keep that shape so code relying on
	// lexical tricks instead of real resolution fails here too.
	if filepath.Base(link) == "device" && rel == filepath.Join("..", "..") {
		rel = filepath.Join("..", "..", "..", filepath.Base(target))
	}
	if strings.HasPrefix(rel, "/") {
		t.tb.Fatalf("symlink %s: target %s outside the tree", link, target)
	}
	if err := os.Symlink(rel, link); err != nil {
		t.tb.Fatal(err)
	}
}
