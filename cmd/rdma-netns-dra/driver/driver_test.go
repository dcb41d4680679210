package driver_test

import (
	"context"
	"io"
	"log"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/driver"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/internal/fakesys"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/pkg/cdi"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"
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
	if !reflect.DeepEqual(withoutMetadata(first.Devices), want) {
		t.Errorf("Prepare = %+v, want %+v", first.Devices, want)
	}
	rec, ok, err := dir.Load("claim-1")
	if err != nil || !ok {
		t.Fatalf("record: %v, %v", ok, err)
	}
	// No configuration: the NIC keeps its host names but for its
	// interface, net1 as Multus would call it.
	wantRec := drarecord.Device{Request: "nics", Pool: pool, Device: fakesys.MlxDevice, PCIAddress: fakesys.MlxAddr, Netdev: fakesys.MlxNetdev, RdmaDevice: fakesys.MlxRDMA,
		Config: &drarecord.NIC{InterfaceName: "net1"}}
	if len(rec.Devices) != 1 || !reflect.DeepEqual(rec.Devices[0], wantRec) || rec.PodUID != "pod-1" || rec.PodName != "pod-pod-1" || rec.PodClaimName != "nics" {
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
	if !reflect.DeepEqual(withoutMetadata(r.Devices), want) {
		t.Errorf("Prepare = %+v, want only %+v", r.Devices, want)
	}
	rec, _, err := dir.Load("claim-4")
	if err != nil || rec == nil || len(rec.Devices) != 1 || rec.Devices[0].PCIAddress != fakesys.VirtioAddr {
		t.Errorf("record %+v (err %v), want only %s", rec, err, fakesys.VirtioAddr)
	}
}

func prepareBatch(t *testing.T, d *driver.Driver, cs ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	out, err := d.PrepareResourceClaims(context.Background(), cs)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if _, ok := out[c.UID]; !ok {
			t.Fatalf("no result for claim %s", c.UID)
		}
	}
	return out
}

// tenant is a claim of another namespace, for the refusals that must not
// name it.
func tenant(uid string, results ...result) *resourceapi.ResourceClaim {
	c := claim(uid, []string{"secret-pod"}, results...)
	c.Namespace, c.Name = "tenant-a", "secret-claim"
	return c
}

// wantHeldRefusal checks the refusal of a NIC another claim holds: it
// names this claim's request and the device, and nothing of the holder.
func wantHeldRefusal(t *testing.T, r kubeletplugin.PrepareResult, request, device string, holder *resourceapi.ResourceClaim) {
	t.Helper()
	if r.Err == nil {
		t.Fatalf("Prepare = %+v, want a refusal of %s, held by another claim", r.Devices, device)
	}
	msg := r.Err.Error()
	for _, want := range []string{"another claim on this node", device, `"` + request + `"`, "cannot start until"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	for _, leak := range []string{holder.Namespace, holder.Name, string(holder.UID), "secret-pod"} {
		if strings.Contains(msg, leak) {
			t.Errorf("refusal %q names the other tenant's %q", msg, leak)
		}
	}
}

// An admin-access request gets a device whoever holds it, and the
// scheduler still counts it free: a NIC of ours moves into one pod's
// netns, so such a claim is refused, and nothing is recorded.
func TestPrepareRefusesAdminAccess(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	c := claim("claim-5", []string{"pod-5"}, result{drarecord.DriverName, "watch", fakesys.MlxDevice})
	c.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	r := prepare(t, newDriver(sys.Root, dir), c)
	if r.Err == nil {
		t.Fatalf("Prepare = %+v, want an admin-access claim refused", r.Devices)
	}
	for _, want := range []string{"adminAccess", `"watch"`, fakesys.MlxDevice, "network namespace", "rdma-netns doctor", "without adminAccess"} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("refusal %q does not say %q", r.Err, want)
		}
	}
	if files := recordFiles(t, dir); len(files) != 0 {
		t.Errorf("records %v written for a refused claim", files)
	}

	// Another driver's admin-access device beside an ordinary NIC of ours
	// is not ours to judge.
	ok := claim("claim-6", []string{"pod-6"}, result{"gpu.example.com", "gpu", "gpu-0"}, result{drarecord.DriverName, "nic", fakesys.MlxDevice})
	ok.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	ok.Status.Allocation.Devices.Results[1].AdminAccess = ptr.To(false)
	if r := prepare(t, newDriver(sys.Root, dir), ok); r.Err != nil {
		t.Errorf("Prepare of a claim with another driver's admin-access device: %v", r.Err)
	}
}

// Two claims of one batch name the same NIC: the first is prepared, the
// second refused, and only the first is recorded.
func TestPrepareBatchOneClaimPerNIC(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	first := tenant("claim-a", result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	second := claim("claim-b", []string{"pod-b"}, result{drarecord.DriverName, "nic", fakesys.VirtioDevice}, result{drarecord.DriverName, "rail", fakesys.MlxDevice})
	out := prepareBatch(t, newDriver(sys.Root, dir), first, second)
	if out[first.UID].Err != nil {
		t.Fatalf("first claim: %v", out[first.UID].Err)
	}
	wantHeldRefusal(t, out[second.UID], "rail", fakesys.MlxDevice, first)
	if files := recordFiles(t, dir); len(files) != 1 || filepath.Base(files[0]) != "claim-a.json" {
		t.Errorf("records %v, want only claim-a's", files)
	}
}

// The record of a claim prepared by an earlier instance of the driver
// (its restart: a new Driver over the same directory) holds the NIC while
// it is still on the host (the pod's sandbox not started yet): a new claim
// for it is refused; one for another NIC is not.
func TestPrepareRefusesNICRecordedEarlier(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	holder := tenant("claim-a", result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	if r := prepare(t, newDriver(sys.Root, dir), holder); r.Err != nil {
		t.Fatal(r.Err)
	}
	restarted := newDriver(sys.Root, dir)
	wantHeldRefusal(t, prepare(t, restarted, claim("claim-b", []string{"pod-b"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})), "nics", fakesys.MlxDevice, holder)
	if r := prepare(t, restarted, claim("claim-c", []string{"pod-c"}, result{drarecord.DriverName, "nics", fakesys.VirtioDevice})); r.Err != nil {
		t.Errorf("Prepare of a free NIC: %v", r.Err)
	}
	if files := recordFiles(t, dir); len(files) != 2 {
		t.Errorf("records %v, want claim-a's and claim-c's", files)
	}
}

// kubelet prepares the same claim twice (in one batch, then again): its
// own record is no conflict.
func TestPrepareSameClaimTwice(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	d := newDriver(sys.Root, dir)
	c := claim("claim-1", []string{"pod-1"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	want := []kubeletplugin.Device{{Requests: []string{"nics"}, PoolName: pool, DeviceName: fakesys.MlxDevice}}
	for round := 1; round <= 2; round++ {
		r := prepareBatch(t, d, c, c)[c.UID]
		if r.Err != nil || !reflect.DeepEqual(withoutMetadata(r.Devices), want) {
			t.Errorf("round %d: Prepare = %+v (err %v), want %+v", round, r.Devices, r.Err, want)
		}
	}
	if files := recordFiles(t, dir); len(files) != 1 {
		t.Errorf("records %v, want one", files)
	}
}

// A damaged record beside the whole ones blocks no pod: it holds no NIC.
func TestPrepareSkipsDamagedRecord(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	if err := os.WriteFile(filepath.Join(string(dir), "claim-x.json"), []byte(`{"version":1,"claimUID":`), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := prepare(t, newDriver(sys.Root, dir), claim("claim-1", []string{"pod-1"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})); r.Err != nil {
		t.Errorf("Prepare beside a damaged record: %v", r.Err)
	}
}

// A FIFO named like a record must not hang Prepare, which holds the
// driver's lock (every later Prepare and Unprepare would wait for good):
// as another claim's record it is skipped, as the claim's own it fails
// that claim alone.
func TestPrepareFIFOInRecordDir(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	fakesys.FIFO(t, filepath.Join(string(dir), "claim-x.json"))
	fakesys.FIFO(t, filepath.Join(string(dir), "claim-2.json"))
	d := newDriver(sys.Root, dir)
	mine := claim("claim-2", []string{"pod-2"}, result{drarecord.DriverName, "nics", fakesys.VirtioDevice})
	other := claim("claim-1", []string{"pod-1"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	var out map[types.UID]kubeletplugin.PrepareResult
	var err error
	fakesys.Within(t, "Prepare beside a FIFO", func() {
		out, err = d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{mine, other})
	})
	if err != nil {
		t.Fatal(err)
	}
	if r := out[mine.UID]; r.Err == nil || !strings.Contains(r.Err.Error(), "not a regular file") {
		t.Errorf("Prepare of the claim whose record is a FIFO: %+v, %v; want a refusal", r.Devices, r.Err)
	}
	if r := out[other.UID]; r.Err != nil {
		t.Errorf("Prepare of a claim beside a FIFO: %v", r.Err)
	}
}

// config is an opaque configuration of this driver in the allocation.
func config(src resourceapi.AllocationConfigSource, requests []string, params string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: src, Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: drarecord.DriverName, Parameters: runtime.RawExtension{Raw: []byte(params)}}}}
}

const nicConfig = `{"apiVersion":"nic.rdma-netns.io/v1alpha1","kind":"NICConfig",`

// The claim's configuration is what each NIC becomes in the pod: Prepare
// resolves it (the class's keys, then the claim's) into the record the
// attach reads, and another driver's configuration is not ours to read.
func TestPrepareRecordsConfig(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	c := claim("claim-c1", []string{"pod-c1"}, result{drarecord.DriverName, "rail0", fakesys.MlxDevice}, result{drarecord.DriverName, "rail1", fakesys.VirtioDevice})
	c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{
		config(resourceapi.AllocationConfigSourceClass, nil, nicConfig+`"rdmaQoS":{"tos":106},"podRdmaDevNamePrefix":"rdma_"}`),
		config(resourceapi.AllocationConfigSourceClaim, []string{"rail0"}, nicConfig+`"interfaceName":"rail0","rdmaDevName":"rdma_r0","addresses":"host"}`),
		{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: "gpu.example.com", Parameters: runtime.RawExtension{Raw: []byte(`{"anything":1}`)}}}},
	}
	r := prepare(t, newDriver(sys.Root, dir), c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	wantMetadata(t, r.Devices[0].Metadata, fakesys.MlxAddr, "rdma_r0", "rail0", "pci0000:10", ptr.To[int64](1))
	wantMetadata(t, r.Devices[1].Metadata, fakesys.VirtioAddr, fakesys.VirtioRDMA, "net2", "pci0000:00", nil)
	rec, _, err := dir.Load("claim-c1")
	if err != nil || rec == nil || len(rec.Devices) != 2 {
		t.Fatalf("record %+v, err %v", rec, err)
	}
	r0, r1 := rec.Devices[0].Config, rec.Devices[1].Config
	if r0 == nil || r0.InterfaceName != "rail0" || r0.RdmaDevName != "rdma_r0" || r0.Addresses != "host" || *r0.RdmaQoS.ToS != 106 {
		t.Errorf("rail0's config in the record: %+v", r0)
	}
	if r1 == nil || r1.InterfaceName != "net2" || r1.RdmaDevName != "" || *r1.RdmaQoS.ToS != 106 {
		t.Errorf("rail1's config in the record: %+v", r1)
	}
	if !rec.Attach {
		t.Errorf("a claim configured for the driver is recorded without attach: the primary network's claims entry would pass its pod by")
	}
}

// A claim that configures nothing of the driver is a NAD's to attach (dra
// mode): its record does not ask the primary network's claims entry to.
func TestPrepareNoConfigNoAttach(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	c := claim("claim-n1", []string{"pod-n1"}, result{drarecord.DriverName, "rail0", fakesys.MlxDevice})
	if r := prepare(t, newDriver(sys.Root, dir), c); r.Err != nil {
		t.Fatal(r.Err)
	}
	rec, _, err := dir.Load("claim-n1")
	if err != nil || rec == nil {
		t.Fatalf("record %+v, err %v", rec, err)
	}
	if rec.Attach {
		t.Errorf("a claim with no configuration of the driver is recorded with attach: both the NAD and the claims entry would attach it")
	}
}

// A bad configuration fails the claim's Prepare with a message naming the
// request and the key, and nothing is recorded (so no NIC moves).
func TestPrepareRefusesBadConfig(t *testing.T) {
	for _, c := range []struct {
		name   string
		cfg    []resourceapi.DeviceAllocationConfiguration
		expect []string
	}{
		{"unknown key", []resourceapi.DeviceAllocationConfiguration{
			config(resourceapi.AllocationConfigSourceClaim, []string{"rail1"}, nicConfig+`"interfaceNmae":"x"}`)}, []string{`"rail1"`, `"interfaceNmae"`}},
		{"duplicate interface", []resourceapi.DeviceAllocationConfiguration{
			config(resourceapi.AllocationConfigSourceClaim, nil, nicConfig+`"interfaceName":"fast"}`)}, []string{`interfaceName "fast"`, `"rail0" and "rail1"`}},
		{"not an address", []resourceapi.DeviceAllocationConfiguration{
			config(resourceapi.AllocationConfigSourceClaim, []string{"rail0"}, nicConfig+`"ipam":{"type":"static","addresses":[{"address":"rail0"}]}}`)}, []string{`"rail0"`, "ipam", "address"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			sys := fakesys.New(t)
			dir := drarecord.Dir(t.TempDir())
			cl := claim("claim-bad", []string{"pod-bad"}, result{drarecord.DriverName, "rail0", fakesys.MlxDevice}, result{drarecord.DriverName, "rail1", fakesys.VirtioDevice})
			cl.Status.Allocation.Devices.Config = c.cfg
			r := prepare(t, newDriver(sys.Root, dir), cl)
			if r.Err == nil {
				t.Fatalf("Prepare = %+v, want the configuration refused", r.Devices)
			}
			for _, w := range append(c.expect, drarecord.DriverName) {
				if !strings.Contains(r.Err.Error(), w) {
					t.Errorf("refusal %q does not say %q", r.Err, w)
				}
			}
			if files := recordFiles(t, dir); len(files) != 0 {
				t.Errorf("records %v written for a refused claim", files)
			}
		})
	}
}

// RDMA device names are unique on a node: a claim may not name its device
// in the pod as another device of the node is named, on the host or in
// another claim's pod.
func TestPrepareRefusesTakenRDMAName(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	d := newDriver(sys.Root, dir)
	named := func(uid, device, name string) *resourceapi.ResourceClaim {
		c := claim(uid, []string{"pod-" + uid}, result{drarecord.DriverName, "nic", device})
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{
			config(resourceapi.AllocationConfigSourceClass, nil, nicConfig+`"rdmaDevName":"`+name+`"}`)}
		return c
	}
	// The host's other NIC is mlx5_0.
	if r := prepare(t, d, named("claim-n1", fakesys.VirtioDevice, fakesys.MlxRDMA)); r.Err == nil || !strings.Contains(r.Err.Error(), "taken on this node") {
		t.Errorf("Prepare naming the device %s, the host's other NIC's name: %v", fakesys.MlxRDMA, r.Err)
	}
	// Its own host name is its own.
	if r := prepare(t, d, named("claim-n2", fakesys.VirtioDevice, fakesys.VirtioRDMA)); r.Err != nil {
		t.Errorf("Prepare naming the device its own host name: %v", r.Err)
	}
	// Another claim's pod has rdma_x: the next claim may not take it.
	if r := prepare(t, d, named("claim-n3", fakesys.MlxDevice, "rdma_x")); r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := dir.Remove("claim-n2"); err != nil {
		t.Fatal(err)
	}
	if r := prepare(t, d, named("claim-n4", fakesys.VirtioDevice, "rdma_x")); r.Err == nil || !strings.Contains(r.Err.Error(), "taken on this node") {
		t.Errorf("Prepare naming the device as another claim's pod names its own: %v", r.Err)
	}
}

// The scheduler gives a NIC to a new claim once the old claim's pod is
// deleted, while the node still tears that pod down: the new claim's
// Prepare waits, without blocking the old claim's Unprepare, and records
// the NIC once it is released. Without the wait (BusyWait 0) the same
// Prepare is refused (TestPrepareRefusesNICRecordedEarlier), and kubelet
// tries again only at its next resync of the pod.
func TestPrepareWaitsForNICBeingReleased(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	d := newDriver(sys.Root, dir)
	d.BusyWait = 10 * time.Second
	holder := tenant("claim-a", result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	if r := prepare(t, d, holder); r.Err != nil {
		t.Fatal(r.Err)
	}
	const release = 300 * time.Millisecond
	unprepared := make(chan error, 1)
	go func() {
		time.Sleep(release)
		out, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: holder.UID}})
		if err == nil {
			err = out[holder.UID]
		}
		unprepared <- err
	}()
	start := time.Now()
	r := prepare(t, d, claim("claim-b", []string{"pod-b"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice}))
	took := time.Since(start)
	if err := <-unprepared; err != nil {
		t.Fatalf("Unprepare of the holder while a Prepare waits: %v", err)
	}
	if r.Err != nil {
		t.Fatalf("Prepare of a NIC released after %s: %v", release, r.Err)
	}
	if took < release || took > release+3*time.Second {
		t.Errorf("Prepare returned after %s, want soon after the release at %s", took, release)
	}
	if files := recordFiles(t, dir); len(files) != 1 || filepath.Base(files[0]) != "claim-b.json" {
		t.Errorf("records %v, want only claim-b's", files)
	}
}

// A NIC that stays held is refused once BusyWait is over, or a second
// before the caller's deadline when that comes first.
func TestPrepareBusyWaitEnds(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	d := newDriver(sys.Root, dir)
	holder := tenant("claim-a", result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	if r := prepare(t, d, holder); r.Err != nil {
		t.Fatal(r.Err)
	}
	for _, c := range []struct {
		name     string
		busyWait time.Duration
		deadline time.Duration
		want     time.Duration
	}{
		{"BusyWait", 500 * time.Millisecond, 0, 500 * time.Millisecond},
		{"caller's deadline", time.Minute, 1500 * time.Millisecond, 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			d.BusyWait = c.busyWait
			ctx := context.Background()
			if c.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.deadline)
				defer cancel()
			}
			start := time.Now()
			nc := claim("claim-b", []string{"pod-b"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})
			out, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{nc})
			took := time.Since(start)
			if err != nil {
				t.Fatal(err)
			}
			wantHeldRefusal(t, out[nc.UID], "nics", fakesys.MlxDevice, holder)
			if took < c.want || took > c.want+2*time.Second {
				t.Errorf("refused after %s, want after about %s", took, c.want)
			}
		})
	}
}

// Two claims of one call naming one NIC: waiting would not release it, so
// the second is refused at once, whatever BusyWait says.
func TestPrepareBatchDuplicateNotWaited(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	d := newDriver(sys.Root, dir)
	d.BusyWait = time.Minute
	first := tenant("claim-a", result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	second := claim("claim-b", []string{"pod-b"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	start := time.Now()
	out := prepareBatch(t, d, first, second)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the batch took %s: the duplicate waited", took)
	}
	if out[first.UID].Err != nil {
		t.Fatalf("first claim: %v", out[first.UID].Err)
	}
	wantHeldRefusal(t, out[second.UID], "nics", fakesys.MlxDevice, first)
}

// A Prepare that waits for a held NIC and is then refused names the
// holding claim in the driver's log once, with its refusal, not once per
// look during the wait; the pod's error still names none of it.
func TestPrepareBusyLogsHolderOnce(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	var logged strings.Builder
	d := &driver.Driver{Records: dir, Scanner: nics.Scanner{Root: sys.Root}, Log: log.New(&logged, "", 0), BusyWait: 800 * time.Millisecond}
	holder := tenant("claim-a", result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	if r := prepare(t, d, holder); r.Err != nil {
		t.Fatal(r.Err)
	}
	wantHeldRefusal(t, prepare(t, d, claim("claim-b", []string{"pod-b"}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})), "nics", fakesys.MlxDevice, holder)
	out := logged.String()
	if n := strings.Count(out, `held by claim "tenant-a"/"secret-claim"`); n != 1 {
		t.Errorf("the holder is named %d times in the log, want once:\n%s", n, out)
	}
	for _, want := range []string{"wait up to", "refused:"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
}

func newCDIDriver(root string, dir drarecord.Dir, spec string) *driver.Driver {
	d := newDriver(root, dir)
	d.CDI = &cdi.Dir{Path: spec}
	return d
}

// With CDI on, Prepare gives the kubelet a CDI device per NIC and records
// the spec directory for the CNI ADD, but writes no spec: the verbs node
// is known only once the NIC is in the pod. A Prepare again (the kubelet
// after its restart) answers the same from the record, even with CDI
// turned off since; Unprepare removes every spec of the claim the ADDs
// wrote, and only the claim's.
func TestPrepareGivesCDIDevices(t *testing.T) {
	sys := fakesys.New(t)
	dir := drarecord.Dir(t.TempDir())
	specs := filepath.Join(t.TempDir(), "cdi")
	c := claim("claim-1", []string{"pod-1"}, result{drarecord.DriverName, "nics", fakesys.VirtioDevice}, result{drarecord.DriverName, "nics", fakesys.MlxDevice})
	d := newCDIDriver(sys.Root, dir, specs)
	r := prepare(t, d, c)
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	ids := func(r kubeletplugin.PrepareResult) []string {
		var out []string
		for _, dev := range r.Devices {
			out = append(out, dev.CDIDeviceIDs...)
		}
		return out
	}
	want := []string{cdi.ID("claim-1", fakesys.VirtioDevice), cdi.ID("claim-1", fakesys.MlxDevice)}
	if got := ids(r); !reflect.DeepEqual(got, want) {
		t.Errorf("CDI devices %v, want %v", got, want)
	}
	if rec, _, _ := dir.Load("claim-1"); rec.CDIDir != specs {
		t.Errorf("record's CDI directory %q, want %q", rec.CDIDir, specs)
	}
	if ents, _ := os.ReadDir(specs); len(ents) != 0 {
		t.Errorf("Prepare wrote %d spec files; the ADD writes them", len(ents))
	}
	if again := prepare(t, newDriver(sys.Root, dir), c); again.Err != nil || !reflect.DeepEqual(ids(again), want) {
		t.Errorf("Prepare again without CDI = %v (%v), want the recorded answer %v", ids(again), again.Err, want)
	}

	// What the ADDs write, and another claim's spec.
	for _, w := range []struct{ uid, dev string }{{"claim-1", fakesys.VirtioDevice}, {"claim-1", fakesys.MlxDevice}, {"claim-2", fakesys.VirtioDevice}} {
		if err := (cdi.Dir{Path: specs}).Write(w.uid, w.dev, cdi.Node{Name: "uverbs3", Major: 231, Minor: 195}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: c.UID}}); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(specs)
	if len(ents) != 1 || !strings.Contains(ents[0].Name(), "claim-2") {
		t.Errorf("after Unprepare of claim-1: %v, want claim-2's spec alone", ents)
	}
}

// wantMetadata checks a NIC's device metadata: its PCI place as the slice
// publishes it, and its names as the pod has them (netdev "" for a NIC a
// NAD attaches, whose name the pod's network selection gives).
func wantMetadata(t *testing.T, m *kubeletplugin.DeviceMetadata, pci, rdma, netdev, root string, numa *int64) {
	t.Helper()
	if m == nil {
		t.Fatalf("%s: no metadata", pci)
	}
	str := func(name string) string {
		if v, ok := m.Attributes[name]; ok && v.StringValue != nil {
			return *v.StringValue
		}
		return ""
	}
	for name, want := range map[string]string{
		"resource.kubernetes.io/pciBusID": pci, "resource.kubernetes.io/pcieRoot": root,
		"nic.rdma-netns.io/rdmaDevice": rdma, "nic.rdma-netns.io/netdev": netdev,
	} {
		if got := str(name); got != want {
			t.Errorf("%s: metadata %s = %q, want %q", pci, name, got, want)
		}
	}
	if got := m.Attributes["resource.kubernetes.io/numaNode"].IntValue; (got == nil) != (numa == nil) || got != nil && *got != *numa {
		t.Errorf("%s: metadata numaNode %v, want %v", pci, got, numa)
	}
	switch {
	case netdev == "" && m.NetworkData != nil:
		t.Errorf("%s: network data %+v for a NIC whose pod name is not known", pci, m.NetworkData)
	case netdev != "" && (m.NetworkData == nil || m.NetworkData.InterfaceName != netdev):
		t.Errorf("%s: network data %+v, want interface %s", pci, m.NetworkData, netdev)
	}
}

// withoutMetadata is devs without their metadata, which wantMetadata
// checks.
func withoutMetadata(devs []kubeletplugin.Device) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, len(devs))
	for i, d := range devs {
		d.Metadata = nil
		out[i] = d
	}
	return out
}
