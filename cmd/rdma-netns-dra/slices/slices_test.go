package slices_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/internal/fakesys"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/slices"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	resourceapi "k8s.io/api/resource/v1"
)

const node = "node1"

func refresh(t *testing.T, root string, dir drarecord.Dir) []resourceapi.Device {
	t.Helper()
	inv, _, err := slices.Refresh(nics.Scanner{Root: root}, dir)
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Resources(node, inv, false)
	pool, ok := res.Pools[node]
	if !ok || len(pool.Slices) != 1 {
		t.Fatalf("pools %+v: want one slice in pool %s", res.Pools, node)
	}
	return pool.Slices[0].Devices
}

func byName(devs []resourceapi.Device) map[string]resourceapi.Device {
	m := map[string]resourceapi.Device{}
	for _, d := range devs {
		m[d.Name] = d
	}
	return m
}

func str(t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName) string {
	t.Helper()
	a, ok := d.Attributes[name]
	if !ok || a.StringValue == nil {
		t.Errorf("device %s: no string attribute %s", d.Name, name)
		return ""
	}
	return *a.StringValue
}

func TestSliceAttributes(t *testing.T) {
	sys := fakesys.New(t)
	devs := byName(refresh(t, sys.Root, drarecord.Dir(t.TempDir())))
	if len(devs) != 2 {
		t.Fatalf("devices %v, want %s and %s", devs, fakesys.VirtioDevice, fakesys.MlxDevice)
	}
	virtio, mlx := devs[fakesys.VirtioDevice], devs[fakesys.MlxDevice]
	if r1, r2 := str(t, virtio, "resource.kubernetes.io/pcieRoot"), str(t, mlx, "resource.kubernetes.io/pcieRoot"); r1 != "pci0000:00" || r2 != "pci0000:10" {
		t.Errorf("pcieRoot %q and %q, want pci0000:00 and pci0000:10", r1, r2)
	}
	if got := str(t, mlx, "resource.kubernetes.io/pciBusID"); got != fakesys.MlxAddr {
		t.Errorf("pciBusID %q, want %s", got, fakesys.MlxAddr)
	}
	if a, ok := virtio.Attributes["resource.kubernetes.io/numaNode"]; ok {
		t.Errorf("numaNode %+v published for a NIC with numa_node -1", a)
	}
	if a := mlx.Attributes["resource.kubernetes.io/numaNode"]; a.IntValue == nil || *a.IntValue != 1 {
		t.Errorf("numaNode %+v, want 1", a)
	}
	for name, want := range map[resourceapi.QualifiedName]string{
		"nic.rdma-netns.io/netdev":     fakesys.VirtioNetdev,
		"nic.rdma-netns.io/rdmaDevice": fakesys.VirtioRDMA,
		"nic.rdma-netns.io/linkLayer":  "Ethernet",
		"nic.rdma-netns.io/pciVendor":  "0x1af4",
		"nic.rdma-netns.io/pciDevice":  "0x1000",
		"k8s.cni.cncf.io/deviceID":     fakesys.VirtioAddr,
		"k8s.cni.cncf.io/resourceName": "nic.rdma-netns.io/rdma",
	} {
		if got := str(t, virtio, name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
}

// A NIC's port goes down when it comes back from a pod (its netdev is down
// on the host until the next pod): what is published of it stays the same
// (TestDRA saw the slice change on that when the port state was published).
func TestAttributesIgnoreLinkState(t *testing.T) {
	sys := fakesys.New(t)
	scanned, _, err := nics.Scanner{Root: sys.Root}.Scan()
	if err != nil {
		t.Fatal(err)
	}
	for _, up := range scanned {
		down := up
		down.PortState, down.SpeedMbps = "DOWN", 0
		if a, b := slices.Attributes(up), slices.Attributes(down); !reflect.DeepEqual(a, b) {
			t.Errorf("%s: attributes with the port up %v differ from with it down %v", up.PCIAddress, a, b)
		}
	}
}

func record(t *testing.T, dir drarecord.Dir, addr, device, netdev, rdma string) {
	t.Helper()
	err := dir.Write(&drarecord.Claim{Version: drarecord.Version, ClaimUID: "claim-1", PodUID: "pod-1", PodName: "p", PodNamespace: "ns",
		Devices: []drarecord.Device{{Request: "nics", Pool: node, Device: device, PCIAddress: addr, Netdev: netdev, RdmaDevice: rdma}}})
	if err != nil {
		t.Fatal(err)
	}
}

// A pod's NIC disappears from the host's sysfs; it stays in the slice,
// with the attributes of the last scan that saw it, across a restart of
// the driver (a new process reading the same record directory).
func TestHeldNICStaysPublishedAcrossRestart(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	refresh(t, sys.Root, dir)
	record(t, dir, fakesys.MlxAddr, fakesys.MlxDevice, fakesys.MlxNetdev, fakesys.MlxRDMA)
	sys.Hold(fakesys.MlxNetdev, fakesys.MlxRDMA)

	devs := byName(refresh(t, sys.Root, dir)) // the restarted driver's first round
	mlx, ok := devs[fakesys.MlxDevice]
	if !ok {
		t.Fatalf("held %s not published: %v", fakesys.MlxDevice, devs)
	}
	if got := str(t, mlx, "nic.rdma-netns.io/linkLayer"); got != "Ethernet" {
		t.Errorf("held NIC's linkLayer %q, want the last scan's Ethernet", got)
	}
	if got := str(t, mlx, "resource.kubernetes.io/pcieRoot"); got != "pci0000:10" {
		t.Errorf("held NIC's pcieRoot %q, want pci0000:10", got)
	}
	if recs, bad, err := dir.List(); err != nil || len(bad) != 0 || len(recs) != 1 {
		t.Errorf("records beside the inventory: %d records, bad %v, err %v; want the one claim", len(recs), bad, err)
	}
}

// A held NIC the driver never saw (its inventory lost) is published from
// the claim's record and from its PCI function, which stays in the host.
func TestHeldNICFromRecordAlone(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	record(t, dir, fakesys.MlxAddr, fakesys.MlxDevice, fakesys.MlxNetdev, fakesys.MlxRDMA)
	sys.Hold(fakesys.MlxNetdev, fakesys.MlxRDMA)
	devs := byName(refresh(t, sys.Root, dir))
	mlx, ok := devs[fakesys.MlxDevice]
	if !ok {
		t.Fatalf("held %s not published: %v", fakesys.MlxDevice, devs)
	}
	if got := str(t, mlx, "nic.rdma-netns.io/rdmaDevice"); got != fakesys.MlxRDMA {
		t.Errorf("rdmaDevice %q, want the record's %s", got, fakesys.MlxRDMA)
	}
	if got := str(t, mlx, "resource.kubernetes.io/pcieRoot"); got != "pci0000:10" {
		t.Errorf("pcieRoot %q, want pci0000:10 from the PCI function, still in the host", got)
	}
	if a := mlx.Attributes["resource.kubernetes.io/numaNode"]; a.IntValue == nil || *a.IntValue != 1 {
		t.Errorf("numaNode %+v, want 1 from the PCI function", a)
	}
}

// A NIC no pod holds that leaves the host (unplugged, driver unbound) is
// no longer offered.
func TestUnheldNICDropped(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	refresh(t, sys.Root, dir)
	sys.Hold(fakesys.MlxNetdev, fakesys.MlxRDMA)
	devs := byName(refresh(t, sys.Root, dir))
	if _, ok := devs[fakesys.MlxDevice]; ok || len(devs) != 1 {
		t.Errorf("devices %v, want only %s", devs, fakesys.VirtioDevice)
	}
}

func TestSharedModePublishesNothing(t *testing.T) {
	sys := fakesys.New(t)
	inv, _, err := slices.Refresh(nics.Scanner{Root: sys.Root}, drarecord.Dir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	res := slices.Resources(node, inv, true)
	if devs := res.Pools[node].Slices[0].Devices; len(devs) != 0 {
		t.Errorf("shared mode published %d devices, want none", len(devs))
	}
}

func TestDeviceName(t *testing.T) {
	if got := slices.DeviceName("0000:3B:00.1"); got != "pci-0000-3b-00-1" {
		t.Errorf("DeviceName = %q, want pci-0000-3b-00-1", got)
	}
}

// The inventory beside the records is read as they are: a FIFO or a
// symbolic link in its place fails the round with a reason, never blocks
// it (the publisher would stop for good) nor is followed.
func TestInventoryNotARegularFile(t *testing.T) {
	sys := fakesys.New(t)
	for name, plant := range map[string]func(t *testing.T, path string){
		"fifo": func(t *testing.T, path string) { fakesys.FIFO(t, path) },
		"symlink": func(t *testing.T, path string) {
			good := drarecord.Dir(t.TempDir())
			refresh(t, sys.Root, good)
			if err := os.Symlink(filepath.Join(string(good), "devices", "inventory"), path); err != nil {
				t.Fatal(err)
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := drarecord.Dir(t.TempDir())
			path := filepath.Join(string(dir), "devices", "inventory")
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			plant(t, path)
			var err error
			fakesys.Within(t, "Refresh with a "+name+" for the inventory", func() {
				_, _, err = slices.Refresh(nics.Scanner{Root: sys.Root}, dir)
			})
			if err == nil || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), "remove it") {
				t.Errorf("Refresh: %v; want a refusal saying it is not a regular file and to remove it", err)
			}
		})
	}
}
