package driver_test

import (
	"context"
	"io"
	"log"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/driver"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/internal/fakesys"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

const pool = "node1"

func newDriver(root string, dir drarecord.Dir) *driver.Driver {
	return &driver.Driver{Records: dir, Scanner: nics.Scanner{Root: root}, Log: log.New(io.Discard, "", 0)}
}

type result struct{ driver, request, device string }

func claim(uid string, pods []string, results ...result) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "pod-nics-x7k2p", UID: types.UID(uid),
			Annotations: map[string]string{driver.PodClaimNameAnnotation: "nics"}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: "pod-" + p, UID: types.UID(p)})
	}
	for _, r := range results {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Driver: r.driver, Request: r.request, Pool: pool, Device: r.device})
	}
	return c
}

func prepare(t *testing.T, d *driver.Driver, c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	t.Helper()
	out, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil {
		t.Fatal(err)
	}
	r, ok := out[c.UID]
	if !ok {
		t.Fatalf("no result for claim %s", c.UID)
	}
	return r
}

func recordFiles(t *testing.T, dir drarecord.Dir) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(string(dir), "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// kubelet asks again (its restart, our timeout): the driver restarted
// meanwhile and the NIC is already in the pod's netns. The answer is the
// first one, from the record, and there is still one record.
func TestPrepareAgainAfterRestart(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	c := claim("claim-1", []string{"pod-1"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	first := prepare(t, newDriver(sys.Root, dir), c)
	if first.Err != nil {
		t.Fatal(first.Err)
	}
	want := []kubeletplugin.Device{{Requests: []string{"nics"}, PoolName: pool, DeviceName: fakesys.MlxDevice}}
	if !reflect.DeepEqual(first.Devices, want) {
		t.Errorf("Prepare = %+v, want %+v", first.Devices, want)
	}
	rec, ok, err := dir.Load("claim-1")
	if err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	wantRec := drarecord.Device{Request: "nics", Pool: pool, Device: fakesys.MlxDevice, PCIAddress: fakesys.MlxAddr, Netdev: fakesys.MlxNetdev, RdmaDevice: fakesys.MlxRDMA}
	if len(rec.Devices) != 1 || rec.Devices[0] != wantRec || rec.PodUID != "pod-1" || rec.PodName != "pod-pod-1" || rec.PodClaimName != "nics" {
		t.Errorf("record %+v, want pod pod-1 (pod-pod-1), pod claim name nics, device %+v", rec, wantRec)
	}

	sys.Hold(fakesys.MlxNetdev, fakesys.MlxRDMA)
	again := prepare(t, newDriver(sys.Root, dir), c)
	if again.Err != nil || !reflect.DeepEqual(again.Devices, first.Devices) {
		t.Errorf("second Prepare = %+v (err %v), want %+v", again.Devices, again.Err, first.Devices)
	}
	if files := recordFiles(t, dir); len(files) != 1 {
		t.Errorf("records %v, want one", files)
	}
}

func TestUnprepareIdempotent(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	d := newDriver(sys.Root, dir)
	c := claim("claim-1", []string{"pod-1"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	if r := prepare(t, d, c); r.Err != nil {
		t.Fatal(r.Err)
	}
	objs := []kubeletplugin.NamespacedObject{
		{NamespacedName: types.NamespacedName{Namespace: "ns", Name: c.Name}, UID: c.UID},
		{NamespacedName: types.NamespacedName{Namespace: "ns", Name: "never"}, UID: "claim-unknown"},
	}
	for round := 1; round <= 2; round++ {
		out, err := d.UnprepareResourceClaims(context.Background(), objs)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			if e, ok := out[o.UID]; !ok || e != nil {
				t.Errorf("round %d: Unprepare of %s = %v (present %v), want success", round, o.UID, e, ok)
			}
		}
		if files := recordFiles(t, dir); len(files) != 0 {
			t.Errorf("round %d: records %v left", round, files)
		}
	}
}

// Another pod holds the NIC (it is not in the host's netns): a new claim
// for it is refused, so the new pod gets no sandbox rather than no NIC.
func TestPrepareRefusesNICHeldElsewhere(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	sys.Hold(fakesys.MlxNetdev, fakesys.MlxRDMA)
	r := prepare(t, newDriver(sys.Root, dir), claim("claim-2", []string{"pod-2"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "held by another pod") || !strings.Contains(r.Err.Error(), fakesys.MlxDevice) {
		t.Errorf("Prepare err = %v, want a refusal naming %s as held by another pod", r.Err, fakesys.MlxDevice)
	}
	if files := recordFiles(t, dir); len(files) != 0 {
		t.Errorf("records %v written for a refused claim", files)
	}
}

func TestPrepareRefusesSharedClaim(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	r := prepare(t, newDriver(sys.Root, dir), claim("claim-3", []string{"pod-a", "pod-b"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice}))
	if r.Err == nil || !strings.Contains(r.Err.Error(), "2 pods") {
		t.Errorf("Prepare err = %v, want a refusal of a claim reserved for 2 pods", r.Err)
	}
	if files := recordFiles(t, dir); len(files) != 0 {
		t.Errorf("records %v written for a refused claim", files)
	}
}

// A claim asks another driver for a GPU beside our NIC: only the NIC is
// ours to prepare and record.
func TestPrepareIgnoresOtherDrivers(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	c := claim("claim-4", []string{"pod-4"},
		result{"gpu.example.com", "gpu", "gpu-0"},
		result{drarecord.DriverName, "nic", fakesys.VirtioDevice},
		result{"gpu.example.com", "gpu2", "pci-0000-10-03-0"})
	r := prepare(t, newDriver(sys.Root, dir), c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	want := []kubeletplugin.Device{{Requests: []string{"nic"}, PoolName: pool, DeviceName: fakesys.VirtioDevice}}
	if !reflect.DeepEqual(r.Devices, want) {
		t.Errorf("Prepare = %+v, want only %+v", r.Devices, want)
	}
	rec, _, err := dir.Load("claim-4")
	if err != nil || rec == nil || len(rec.Devices) != 1 || rec.Devices[0].PCIAddress != fakesys.VirtioAddr {
		t.Errorf("record %+v (err %v), want only %s", rec, err, fakesys.VirtioAddr)
	}
}
