package gpudriver

import (
	"context"
	"io"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
)

const (
	driverName = "gpu.e2e.rdma-netns.io"
	gpu0       = "0000:00:07.0" // under pci0000:00, NUMA node 0
	gpu1       = "0000:10:02.0" // behind a bridge under pci0000:10, NUMA node 1
	gpu2       = "0000:00:08.0" // under pci0000:00, no NUMA affinity
)

// fakeNode is the sysfs of a node with two PCIe root complexes, laid out
// as the kernel does.
func fakeNode(t *testing.T) string {
	t.Helper()
	tree := sysfstest.New(t)
	fn := func(path, numa string) {
		tree.PCI(path)
		if err := os.WriteFile(filepath.Join(tree.Path(path), "numa_node"), []byte(numa+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fn("pci0000:00/"+gpu0, "0")
	fn("pci0000:00/"+gpu2, "-1")
	fn("pci0000:10/0000:10:00.0", "1")
	fn("pci0000:10/0000:10:00.0/"+gpu1, "1")
	return tree.Root
}

func newDriver(t *testing.T, pci ...string) *Driver {
	t.Helper()
	d, err := New(driverName, pci, fakeNode(t))
	if err != nil {
		t.Fatal(err)
	}
	d.Log = log.New(io.Discard, "", 0)
	return d
}

func str(s string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{StringValue: ptr.To(s)}
}
func num(n int64) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{IntValue: ptr.To(n)}
}

// Each listed function is one GPU, named for its address, carrying the
// attributes a claim aligns a NIC by: its PCIe root, its bus ID, its NUMA
// node (none when the kernel gives it no affinity) and its index.
func TestDevicesFromSysfs(t *testing.T) {
	d := newDriver(t, gpu0, gpu1, gpu2)
	want := []resourceapi.Device{
		{Name: "gpu-0000-00-07-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pcieRoot": str("pci0000:00"),
			"resource.kubernetes.io/pciBusID": str(gpu0),
			"resource.kubernetes.io/numaNode": num(0),
			"gpu.e2e.rdma-netns.io/index":     num(0),
		}},
		{Name: "gpu-0000-10-02-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pcieRoot": str("pci0000:10"),
			"resource.kubernetes.io/pciBusID": str(gpu1),
			"resource.kubernetes.io/numaNode": num(1),
			"gpu.e2e.rdma-netns.io/index":     num(1),
		}},
		{Name: "gpu-0000-00-08-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pcieRoot": str("pci0000:00"),
			"resource.kubernetes.io/pciBusID": str(gpu2),
			"gpu.e2e.rdma-netns.io/index":     num(2),
		}},
	}
	got := d.Devices()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("devices:\n%s\nwant\n%s", describe(got), describe(want))
	}
	// The caller may change what it got; the published list stays.
	got[0].Attributes[AttrIndex] = num(7)
	if again := d.Devices(); !reflect.DeepEqual(again, want) {
		t.Errorf("after the caller changed its copy, devices:\n%s\nwant\n%s", describe(again), describe(want))
	}
}

func describe(devs []resourceapi.Device) string {
	var b strings.Builder
	for _, d := range devs {
		b.WriteString(d.Name + ":")
		names := make([]string, 0, len(d.Attributes))
		for name := range d.Attributes {
			names = append(names, string(name))
		}
		sort.Strings(names)
		for _, name := range names {
			a := d.Attributes[resourceapi.QualifiedName(name)]
			switch {
			case a.StringValue != nil:
				b.WriteString(" " + name + "=" + *a.StringValue)
			case a.IntValue != nil:
				b.WriteString(" " + name + "=" + strconv.FormatInt(*a.IntValue, 10))
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// A GPU the node does not have is refused, not published without the
// PCIe root a claim would align it by.
func TestRefusesWhatIsNotAPCIFunction(t *testing.T) {
	root := fakeNode(t)
	for _, pci := range [][]string{
		{gpu0, "0000:00:09.0"}, // not on the node
		{"0000:00:07.0 "},      // not an address
		{"0000:00:07.0", "0000:00:07.0"},
		nil,
	} {
		d, err := New(driverName, pci, root)
		if err == nil {
			t.Errorf("New(%q) = %d devices, want an error", pci, len(d.Devices()))
			continue
		}
		if !strings.Contains(err.Error(), driverName) {
			t.Errorf("New(%q): %v, want the driver named", pci, err)
		}
	}
}

type result struct{ driver, request, device string }

func claim(uid string, results ...result) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod-gpu-nic-x7k2p", UID: types.UID(uid)},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, r := range results {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Driver: r.driver, Request: r.request, Pool: "node1", Device: r.device})
	}
	return c
}

// kubelet gets the claim's GPUs back as prepared, not the NIC another
// driver holds in the same claim; the test reads what was prepared until
// kubelet unprepares it, and unpreparing a claim never prepared succeeds.
func TestPrepareAndUnprepare(t *testing.T) {
	d := newDriver(t, gpu0, gpu1)
	ctx := context.Background()
	c := claim("claim-1",
		result{driverName, "gpu", "gpu-0000-10-02-0"},
		result{"rdma-netns.io", "nic", "pci-0000-10-03-0"},
		result{driverName, "gpu", "gpu-0000-00-07-0"})
	bad := claim("claim-2", result{driverName, "gpu", "gpu-0000-00-09-0"})
	out, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c, bad})
	if err != nil {
		t.Fatal(err)
	}
	want := []kubeletplugin.Device{
		{Requests: []string{"gpu"}, PoolName: "node1", DeviceName: "gpu-0000-10-02-0"},
		{Requests: []string{"gpu"}, PoolName: "node1", DeviceName: "gpu-0000-00-07-0"},
	}
	if got := out["claim-1"]; got.Err != nil || !reflect.DeepEqual(got.Devices, want) {
		t.Errorf("prepared claim-1: %+v, want devices %+v", got, want)
	}
	if got := out["claim-2"]; got.Err == nil || !strings.Contains(got.Err.Error(), "gpu-0000-00-09-0") {
		t.Errorf("prepared claim-2 with a GPU the driver does not publish: %+v, want an error naming it", got)
	}
	wantPrepared := map[types.UID][]string{"claim-1": {"gpu-0000-10-02-0", "gpu-0000-00-07-0"}}
	if got := d.Prepared(); !reflect.DeepEqual(got, wantPrepared) {
		t.Errorf("Prepared() = %v, want %v", got, wantPrepared)
	}

	un, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{
		{NamespacedName: types.NamespacedName{Namespace: "ns", Name: c.Name}, UID: "claim-1"},
		{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "never"}, UID: "claim-3"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(un) != 2 || un["claim-1"] != nil || un["claim-3"] != nil {
		t.Errorf("unprepare = %v, want success for both claims", un)
	}
	if got := d.Prepared(); len(got) != 0 {
		t.Errorf("after unprepare, Prepared() = %v, want nothing", got)
	}
}

// The class a test's claim names selects this driver's devices only.
func TestDeviceClass(t *testing.T) {
	dc := DeviceClass("e2e-gpu", driverName)
	if dc.Name != "e2e-gpu" || len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil ||
		dc.Spec.Selectors[0].CEL.Expression != `device.driver == "gpu.e2e.rdma-netns.io"` {
		t.Errorf("DeviceClass = %+v", dc)
	}
}

func TestHealthNotSupported(t *testing.T) {
	d := newDriver(t, gpu0)
	if err := d.WatchHealthStatus(context.Background(), nil); err != kubeletplugin.ErrHealthNotSupported {
		t.Errorf("WatchHealthStatus = %v, want ErrHealthNotSupported", err)
	}
}

// Started, the driver publishes one slice of its GPUs in a pool named for
// the node, which is where a claim's allocation finds them.
func TestStartPublishesThePool(t *testing.T) {
	d := newDriver(t, gpu0, gpu1)
	dir := t.TempDir()
	d.registrarDir, d.pluginDir = filepath.Join(dir, "registry"), filepath.Join(dir, "plugin")
	// kubelet made its registry; the driver's own directory is new.
	if err := os.Mkdir(d.registrarDir, 0o755); err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1", UID: "node1-uid"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := d.Start(ctx, kube, "node1"); err != nil {
		t.Fatal(err)
	}
	defer d.Stop()
	if err := d.Start(ctx, kube, "node1"); err == nil {
		t.Error("started twice, want an error the second time")
	}

	// kubelet finds the driver by its socket in the registry directory.
	if socks, _ := filepath.Glob(filepath.Join(d.registrarDir, driverName+"*.sock")); len(socks) != 1 {
		t.Errorf("registration sockets in %s: %v, want one for %s", d.registrarDir, socks, driverName)
	}

	var slices []resourceapi.ResourceSlice
	for ctx.Err() == nil {
		l, err := kube.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if slices = l.Items; len(slices) > 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(slices) != 1 {
		t.Fatalf("%d ResourceSlices published, want 1", len(slices))
	}
	s := slices[0].Spec
	if s.Driver != driverName || s.Pool.Name != "node1" || ptr.Deref(s.NodeName, "") != "node1" {
		t.Errorf("slice: driver %s, pool %s, node %q; want %s, node1, node1", s.Driver, s.Pool.Name, ptr.Deref(s.NodeName, ""), driverName)
	}
	if !reflect.DeepEqual(s.Devices, d.Devices()) {
		t.Errorf("slice devices:\n%s\nwant\n%s", describe(s.Devices), describe(d.Devices()))
	}
}
