package driver_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/cdi"
	cdilib "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// The specs the CNI ADD writes (package cdi, in the root module, which
// does not link the CDI library) are what the runtime's CDI library,
// containerd's, resolves: each claimed NIC's ID gives exactly its uverbs
// node and rdma_cm, with the kernel's numbers, mode 0666 and rw; two
// claims' specs do not collide; the claim's Remove takes its own alone.
func TestSpecsResolveInTheRuntimesLibrary(t *testing.T) {
	dir := cdi.Dir{Path: filepath.Join(t.TempDir(), "cdi")}
	cm := &cdi.Node{Name: "rdma_cm", Major: 10, Minor: 58}
	written := map[string]cdi.Node{
		cdi.ID("uid-a", "pci-0000-00-05-0"): {Name: "uverbs1", Major: 231, Minor: 193},
		cdi.ID("uid-a", "pci-0000-00-06-0"): {Name: "uverbs2", Major: 231, Minor: 194},
		cdi.ID("uid-b", "pci-0000-00-07-0"): {Name: "uverbs0", Major: 231, Minor: 192},
	}
	for _, w := range []struct{ uid, dev string }{{"uid-a", "pci-0000-00-05-0"}, {"uid-a", "pci-0000-00-06-0"}, {"uid-b", "pci-0000-00-07-0"}} {
		if err := dir.Write(w.uid, w.dev, written[cdi.ID(w.uid, w.dev)], cm); err != nil {
			t.Fatal(err)
		}
	}
	cache := resolve(t, dir.Path)
	for id, uverbs := range written {
		dev := cache.GetDevice(id)
		if dev == nil {
			t.Fatalf("%s does not resolve; the cache has %v", id, cache.ListDevices())
		}
		var got []cdispec.DeviceNode
		for _, n := range append(slices.Clone(dev.GetSpec().ContainerEdits.DeviceNodes), dev.ContainerEdits.DeviceNodes...) {
			got = append(got, *n)
		}
		mode := os.FileMode(0o666)
		want := []cdispec.DeviceNode{
			{Path: "/dev/infiniband/rdma_cm", Type: "c", Major: 10, Minor: 58, FileMode: &mode, Permissions: "rw"},
			{Path: "/dev/infiniband/" + uverbs.Name, Type: "c", Major: int64(uverbs.Major), Minor: int64(uverbs.Minor), FileMode: &mode, Permissions: "rw"},
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s gives %+v, want %+v", id, got, want)
		}
	}

	if err := dir.Remove("uid-a"); err != nil {
		t.Fatal(err)
	}
	if got, want := resolve(t, dir.Path).ListDevices(), []string{cdi.ID("uid-b", "pci-0000-00-07-0")}; !reflect.DeepEqual(got, want) {
		t.Errorf("after claim uid-a's Remove: %v, want %v", got, want)
	}
}

// resolve reads dir as the runtime does, and fails on any spec it refuses.
func resolve(t *testing.T, dir string) *cdilib.Cache {
	t.Helper()
	cache, err := cdilib.NewCache(cdilib.WithSpecDirs(dir), cdilib.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("the runtime's CDI library refuses the specs: %v", errs)
	}
	return cache
}
