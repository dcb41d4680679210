package nssysfs

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/podns/podnstest"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and mounts sysfs")
	}
}

// addDummy creates netdevs name and name+"-p" (a veth pair: the kernel
// may lack the dummy driver) in the netns at path.
func addDummy(t *testing.T, path, name string) {
	t.Helper()
	ns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "-p"}); err != nil {
		t.Fatalf("dummy %s in %s: %v", name, path, err)
	}
}

func viewClassNet(t *testing.T, v *Views, path string) []string {
	t.Helper()
	var names []string
	if err := v.In(path, func(root string) error {
		names = podnstest.Netdevs(t, root)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return names
}

// Each netns is read through its own view, however often and in whatever
// order, one view is kept per netns, and the caller's /sys and netns are
// left alone; Sweep lets go of the views no longer read.
func TestViewsShowEachNetnsItsOwn(t *testing.T) {
	needRoot(t)
	var paths []string
	for _, name := range []string{"view-a", "view-b"} {
		ns, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		defer testutils.UnmountNS(ns)
		defer ns.Close()
		addDummy(t, ns.Path(), name)
		paths = append(paths, ns.Path())
	}
	before, err := inventory.Stat("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	hostNet := podnstest.Netdevs(t, "/sys")
	var v Views
	for range 3 {
		for i, want := range [][]string{{"lo", "view-a", "view-a-p"}, {"lo", "view-b", "view-b-p"}} {
			if got := viewClassNet(t, &v, paths[i]); !slices.Equal(got, want) {
				t.Fatalf("class/net of %s = %v, want %v", paths[i], got, want)
			}
		}
	}
	if v.Len() != 2 {
		t.Fatalf("%d views kept for 2 namespaces", v.Len())
	}
	if got := podnstest.Netdevs(t, "/sys"); !slices.Equal(got, hostNet) {
		t.Fatalf("host /sys/class/net changed: %v -> %v", hostNet, got)
	}
	if after, _ := inventory.Stat("/proc/self/ns/net"); after != before {
		t.Fatal("the caller's main thread left its netns")
	}
	v.Sweep() // both were read since the start
	viewClassNet(t, &v, paths[0])
	v.Sweep()
	if v.Len() != 1 {
		t.Fatalf("%d views kept after a Sweep with one netns read, want 1", v.Len())
	}
	v.Sweep()
	if v.Len() != 0 {
		t.Fatalf("%d views kept after a Sweep with none read", v.Len())
	}
	if err := v.In("/nonexistent", func(string) error { return nil }); err == nil {
		t.Fatal("no error for a missing netns")
	}
}

// A view keeps no netns alive: when the pod's netns goes, its netdevs (and,
// on a node, its RDMA devices) go with it although the view is still held.
func TestViewsKeepNoNetnsAlive(t *testing.T) {
	needRoot(t)
	ns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	fd, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nssysfs-host"}, PeerName: "nssysfs-pod", PeerNamespace: netlink.NsFd(int(fd.Fd()))}
	err = netlink.LinkAdd(veth)
	fd.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer netlink.LinkDel(veth)
	var v Views
	if got := viewClassNet(t, &v, ns.Path()); !slices.Equal(got, []string{"lo", "nssysfs-pod"}) {
		t.Fatalf("class/net in the pod = %v", got)
	}
	ns.Close()
	if err := testutils.UnmountNS(ns); err != nil {
		t.Fatal(err)
	}
	// The kernel tears a netns down on a work queue; its veth's host end
	// goes with it.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := netlink.LinkByName("nssysfs-host"); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the netns outlived its last reference but the view (%d kept): its veth is still on the host", v.Len())
		}
	}
	v.Sweep()
	v.Sweep()
	if v.Len() != 0 {
		t.Fatalf("%d views kept for a netns that is gone", v.Len())
	}
}

// A netns created at the path of one that is gone (where the kernel may
// hand out the same inode number again) is read through a view of its own,
// never through the old one.
func TestViewsNeverShowAGoneNetnsInPlaceOfANewOne(t *testing.T) {
	needRoot(t)
	path := filepath.Join(t.TempDir(), "netns")
	var v Views
	for _, dummy := range []string{"first", "second", "third"} {
		if err := podnstest.MountNew(path); err != nil {
			t.Fatal(err)
		}
		addDummy(t, path, dummy)
		want := []string{dummy, dummy + "-p", "lo"}
		slices.Sort(want)
		if got := viewClassNet(t, &v, path); !slices.Equal(got, want) {
			t.Errorf("class/net of the netns with %s = %v", dummy, got)
		}
		if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
			t.Fatal(err)
		}
	}
}
