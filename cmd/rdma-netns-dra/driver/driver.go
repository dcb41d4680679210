// Package driver is the kubelet side of rdma-netns-dra: Prepare records
// which NICs a claim's pod gets, for the rdma-netns CNI plugin to attach
// when the pod's sandbox starts; Unprepare forgets them. Neither touches
// the kernel's devices: the CNI plugin moves them, and the records are
// all that passes between the two (package drarecord).
package driver

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/slices"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// PodClaimNameAnnotation is set by the resourceclaim controller on a claim
// it made from a pod's template: the pod's name for the claim.
const PodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name"

// Scanner lists the NICs the host sees now.
type Scanner interface {
	Scan() ([]nics.NIC, []nics.Skipped, error)
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	Records drarecord.Dir
	Scanner Scanner
	Log     *log.Logger

	// mu orders Prepare and Unprepare against each other: the helper
	// serializes gRPC calls by default, but a refusal decided on a scan
	// must not race a record being written for the same NIC.
	mu sync.Mutex
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// PrepareResourceClaims records each claim's NICs for its pod. A claim's
// error fails only that claim's pod start: kubelet creates no sandbox,
// so no pod starts without the NICs it asked for.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	var visible map[string]nics.NIC // scanned once, on the first claim that needs it
	for _, c := range claims {
		rec, err := d.prepare(c, &visible)
		if err != nil {
			d.Log.Printf("prepare: claim %s/%s (%s): refused: %v", c.Namespace, c.Name, c.UID, err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: result(rec)}
	}
	return out, nil
}

func (d *Driver) prepare(c *resourceapi.ResourceClaim, visible *map[string]nics.NIC) (*drarecord.Claim, error) {
	// kubelet asks again after its restart or a timeout of ours; the
	// record answers, whatever the kernel shows now (the NIC may already
	// be in the pod's netns).
	if rec, ok, err := d.Records.Load(string(c.UID)); err != nil {
		return nil, fmt.Errorf("reading the claim's earlier record: %w", err)
	} else if ok {
		d.Log.Printf("prepare: claim %s/%s (%s) for pod %s/%s (%s): already recorded, %s", c.Namespace, c.Name, c.UID,
			rec.PodNamespace, rec.PodName, rec.PodUID, describe(rec.Devices))
		return rec, nil
	}
	pod, err := reservedPod(c)
	if err != nil {
		return nil, err
	}
	results := ours(c)
	rec := &drarecord.Claim{
		Version:        drarecord.Version,
		ClaimUID:       string(c.UID),
		ClaimNamespace: c.Namespace,
		ClaimName:      c.Name,
		PodClaimName:   c.Annotations[PodClaimNameAnnotation],
		PodUID:         string(pod.UID),
		PodNamespace:   c.Namespace,
		PodName:        pod.Name,
	}
	if len(results) > 0 && *visible == nil {
		*visible, err = d.scan()
		if err != nil {
			return nil, err
		}
	}
	for _, r := range results {
		n, ok := (*visible)[r.Device]
		if !ok {
			return nil, fmt.Errorf("device %s (request %q) is not in the host's network namespace: held by another pod's netns, or gone from the node; "+
				"the pod cannot start until it is back on the host", r.Device, r.Request)
		}
		rec.Devices = append(rec.Devices, drarecord.Device{
			Request: r.Request, Pool: r.Pool, Device: r.Device,
			PCIAddress: n.PCIAddress, Netdev: n.Netdev, RdmaDevice: n.RdmaDevice,
		})
	}
	if err := d.Records.Write(rec); err != nil {
		return nil, fmt.Errorf("writing the record for the CNI plugin: %w", err)
	}
	d.Log.Printf("prepare: claim %s/%s (%s) for pod %s/%s (%s): recorded %s", c.Namespace, c.Name, c.UID,
		rec.PodNamespace, rec.PodName, rec.PodUID, describe(rec.Devices))
	return rec, nil
}

// scan is the host's NICs by device name.
func (d *Driver) scan() (map[string]nics.NIC, error) {
	found, _, err := d.Scanner.Scan()
	if err != nil {
		return nil, fmt.Errorf("listing the host's RDMA NICs: %w", err)
	}
	m := make(map[string]nics.NIC, len(found))
	for _, n := range found {
		m[slices.DeviceName(n.PCIAddress)] = n
	}
	return m, nil
}

// reservedPod is the one pod the claim is for. The NICs are exclusive (a
// netns holds them), so a claim shared by two pods cannot be served.
func reservedPod(c *resourceapi.ResourceClaim) (resourceapi.ResourceClaimConsumerReference, error) {
	var pods []resourceapi.ResourceClaimConsumerReference
	for _, r := range c.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			pods = append(pods, r)
		}
	}
	if len(pods) != 1 {
		return resourceapi.ResourceClaimConsumerReference{}, fmt.Errorf(
			"the claim is reserved for %d pods; a NIC of %s moves into one pod's network namespace, so give each pod a claim of its own (a ResourceClaimTemplate)",
			len(pods), drarecord.DriverName)
	}
	return pods[0], nil
}

// ours is the claim's allocation results of this driver: a claim may ask
// other drivers for a GPU beside the NIC.
func ours(c *resourceapi.ResourceClaim) []resourceapi.DeviceRequestAllocationResult {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []resourceapi.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == drarecord.DriverName {
			out = append(out, r)
		}
	}
	return out
}

// result tells kubelet which devices were prepared; no CDI devices: the
// device nodes come from rdma-netns-nri, for the RDMA devices that reach
// the pod's netns.
func result(rec *drarecord.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, dev := range rec.Devices {
		out = append(out, kubeletplugin.Device{Requests: []string{dev.Request}, PoolName: dev.Pool, DeviceName: dev.Device})
	}
	return out
}

func describe(devs []drarecord.Device) string {
	if len(devs) == 0 {
		return "no device of this driver"
	}
	s := ""
	for i, d := range devs {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s (request %q, PCI %s, netdev %s, RDMA %s)", d.Device, d.Request, d.PCIAddress, d.Netdev, d.RdmaDevice)
	}
	return s
}

// UnprepareResourceClaims forgets the claims. kubelet calls it after the
// pod's sandbox is gone (CNI DEL has returned the NICs), and it never
// waits on the kernel: a NIC unbound meanwhile must not keep the pod from
// terminating. A claim never prepared is already forgotten.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		rec, had, _ := d.Records.Load(string(c.UID))
		err := d.Records.Remove(string(c.UID))
		out[c.UID] = err
		switch {
		case err != nil:
			d.Log.Printf("unprepare: claim %s (%s): removing its record: %v", c.NamespacedName, c.UID, err)
		case had:
			d.Log.Printf("unprepare: claim %s (%s) of pod %s/%s (%s): record removed, %s", c.NamespacedName, c.UID,
				rec.PodNamespace, rec.PodName, rec.PodUID, describe(rec.Devices))
		default:
			d.Log.Printf("unprepare: claim %s (%s): no record, nothing to do", c.NamespacedName, c.UID)
		}
	}
	return out, nil
}

// HandleError logs what the helper could not do in the background
// (publishing the slice, mostly); it retries the recoverable ones itself.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.Log.Printf("%s: %v (retried)", msg, err)
		return
	}
	d.Log.Printf("%s: %v", msg, err)
}

// WatchHealthStatus: the driver reports no device health (main turns the
// health service off; this answers if it is ever asked).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
