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
	"strings"
	"sync"
	"time"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/slices"
	"github.com/rdma-netns/rdma-netns/pkg/cdi"
	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/draconfig"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// PodClaimNameAnnotation is set by the resourceclaim controller on a claim
// it made from a pod's template: the pod's name for the claim.
const PodClaimNameAnnotation = "resource.kubernetes.io/pod-claim-name"

// Scanner lists the NICs the host sees now, and describes a NIC's PCI
// function, which stays on the host while a pod holds the NIC.
type Scanner interface {
	Scan() ([]nics.NIC, []nics.Skipped, error)
	DescribePCI(n *nics.NIC)
}

// Driver implements kubeletplugin.DRAPlugin.
type Driver struct {
	Records drarecord.Dir
	Scanner Scanner
	Log     *log.Logger
	// CDI, when set, is the CDI spec directory: Prepare gives the kubelet
	// a CDI device per NIC and records the directory for the CNI ADD,
	// which writes each NIC's spec (its verbs nodes) once the NIC is in
	// the pod; Unprepare removes them (package cdi). Nil: no CDI devices
	// (the NRI plugin gives the nodes).
	CDI *cdi.Dir
	// BusyWait is how long Prepare waits for a NIC that another claim's
	// record still holds, or that is not back on the host yet, before it
	// refuses the claim (0: at once). The scheduler gives a NIC to a new
	// claim as soon as the old claim's pod is deleted, while the old pod's
	// sandbox is still being torn down on the node; and kubelet tries a
	// refused Prepare again only at its next resync of the pod, 60 to 90
	// s later (kuberuntime's SyncPod returns no error for it), so a
	// refusal there costs the new pod that long.
	BusyWait time.Duration

	// mu orders Prepare and Unprepare against each other: a refusal
	// decided on a scan must not race a record being written for the same
	// NIC. It is the only order: main turns the helper's serialization of
	// gRPC calls off, so that an Unprepare runs while a Prepare waits for
	// the NIC it releases.
	mu sync.Mutex
}

// busyPoll is how often a waiting Prepare looks again.
const busyPoll = 250 * time.Millisecond

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// PrepareResourceClaims records each claim's NICs for its pod. A claim's
// error fails only that claim's pod start: kubelet creates no sandbox,
// so no pod starts without the NICs it asked for, and it shows the error
// in the pod's FailedPrepareDynamicResources event. So an error names
// only what the claim's own pod may see.
//
// A claim whose NIC is busy (another claim's record holds it, or it is not
// on the host) waits up to BusyWait, without the lock, for the NIC to be
// released, then is refused.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	until := d.busyDeadline(ctx)
	mine := make(map[string]bool, len(claims))
	for _, c := range claims {
		mine[string(c.UID)] = true
	}
	start := time.Now()
	for waited := false; ; waited = true {
		claims = d.prepareRound(claims, mine, time.Now().Before(until), out)
		if len(claims) == 0 {
			if waited {
				d.Log.Printf("prepare: done after waiting %s for busy NICs", time.Since(start).Round(time.Millisecond))
			}
			break
		}
		if !waited {
			d.Log.Printf("prepare: %d claim(s) wait up to %s for their NICs to be released", len(claims), time.Until(until).Round(time.Second))
		}
		select {
		case <-ctx.Done():
			until = time.Time{}
		case <-time.After(busyPoll):
		}
	}
	return out, nil
}

// prepareRound prepares the claims under the lock and returns those to
// try again: busy ones, while wait holds.
func (d *Driver) prepareRound(claims []*resourceapi.ResourceClaim, mine map[string]bool, wait bool, out map[types.UID]kubeletplugin.PrepareResult) []*resourceapi.ResourceClaim {
	d.mu.Lock()
	defer d.mu.Unlock()
	var again []*resourceapi.ResourceClaim
	b := &batch{}
	for _, c := range claims {
		rec, err := d.prepare(c, b)
		var busy *busyError
		// A NIC held by a claim of this same call is not released by
		// waiting: refused at once.
		if wait && errors.As(err, &busy) && !mine[busy.holderUID()] {
			again = append(again, c)
			continue
		}
		if err != nil {
			if errors.As(err, &busy) && busy.holder != nil {
				h := busy.holder
				d.Log.Printf("prepare: claim %s/%s (%s): its NIC is held by claim %q/%q (%s) of pod %q/%q (%s)", c.Namespace, c.Name, c.UID,
					h.ClaimNamespace, h.ClaimName, h.ClaimUID, h.PodNamespace, h.PodName, h.PodUID)
			}
			d.Log.Printf("prepare: claim %s/%s (%s): refused: %v", c.Namespace, c.Name, c.UID, err)
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: d.result(rec)}
	}
	return again
}

// busyDeadline is when a busy claim stops waiting: BusyWait from now, and
// a second before the caller's deadline (kubelet's is 45 s), so that the
// refusal still reaches the pod's events.
func (d *Driver) busyDeadline(ctx context.Context) time.Time {
	until := time.Now().Add(d.BusyWait)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-time.Second).Before(until) {
		until = dl.Add(-time.Second)
	}
	return until
}

// busyError is a refusal that may pass: the NIC is held by the claim
// whose record is holder (nil: by no record, but not on the host).
type busyError struct {
	holder *drarecord.Claim
	err    error
}

func (e *busyError) Error() string { return e.err.Error() }

// holderUID is the holding claim's UID, "" when no record holds the NIC.
func (e *busyError) holderUID() string {
	if e.holder == nil {
		return ""
	}
	return e.holder.ClaimUID
}

// batch is what one Prepare call learns once, on the first claim that
// needs it, and shares among its claims.
type batch struct {
	// visible is the host's NICs by device name.
	visible map[string]nics.NIC
	// held is the NICs the claims' records hold, this batch's included.
	held *holders
}

// holders finds the claim whose record holds a NIC, by the NIC's device
// name or its PCI address (the identity; the name is derived from it).
type holders struct {
	byDevice, byPCI map[string]*drarecord.Claim
}

func (h *holders) add(c *drarecord.Claim) {
	for _, dev := range c.Devices {
		h.byDevice[dev.Device] = c
		h.byDevice[slices.DeviceName(dev.PCIAddress)] = c
		h.byPCI[strings.ToLower(dev.PCIAddress)] = c
	}
}

// other is the claim other than uid that holds device (or the NIC at
// pci, when known), nil when none.
func (h *holders) other(uid types.UID, device, pci string) *drarecord.Claim {
	for _, c := range []*drarecord.Claim{h.byDevice[device], h.byPCI[strings.ToLower(pci)]} {
		if c != nil && c.ClaimUID != string(uid) {
			return c
		}
	}
	return nil
}

// held reads every claim's record once per batch. A damaged record holds
// nothing: it must not keep pods from starting; the log and the doctor
// name it.
func (d *Driver) held(b *batch) (*holders, error) {
	if b.held != nil {
		return b.held, nil
	}
	recs, bad, err := d.Records.List()
	if err != nil {
		return nil, fmt.Errorf("reading the claims' records, which say which NICs are taken: %w", err)
	}
	for _, why := range bad {
		d.Log.Printf("prepare: skipping a damaged record, it holds no NIC: %q (rdma-netns doctor reports it)", why)
	}
	b.held = &holders{byDevice: map[string]*drarecord.Claim{}, byPCI: map[string]*drarecord.Claim{}}
	for _, c := range recs {
		b.held.add(c)
	}
	return b.held, nil
}

func (d *Driver) prepare(c *resourceapi.ResourceClaim, b *batch) (*drarecord.Claim, error) {
	results := ours(c)
	if err := refuseAdminAccess(results); err != nil {
		return nil, err
	}
	// The claim's configuration is checked before anything is recorded:
	// a bad key fails the pod's start with its message, and no NIC moves.
	configs, attach, err := resolveConfig(c, results)
	if err != nil {
		return nil, err
	}
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
	rec := &drarecord.Claim{
		Version:        drarecord.Version,
		ClaimUID:       string(c.UID),
		ClaimNamespace: c.Namespace,
		ClaimName:      c.Name,
		PodClaimName:   c.Annotations[PodClaimNameAnnotation],
		PodUID:         string(pod.UID),
		PodNamespace:   c.Namespace,
		PodName:        pod.Name,
		Attach:         attach,
	}
	if len(results) > 0 && b.visible == nil {
		b.visible, err = d.scan()
		if err != nil {
			return nil, err
		}
	}
	var held *holders
	if len(results) > 0 {
		if held, err = d.held(b); err != nil {
			return nil, err
		}
	}
	for i, r := range results {
		n, ok := b.visible[r.Device]
		// The scheduler gives a NIC to one claim at a time, but a claim
		// still recorded keeps it until Unprepare, even while the NIC is
		// on the host (its pod's sandbox not started yet).
		if h := held.other(c.UID, r.Device, n.PCIAddress); h != nil {
			// The holder is named in the driver's log only (busyError's
			// holder, logged with the refusal), never in the pod's event.
			return nil, &busyError{h, fmt.Errorf("device %s (request %q) is held by another claim on this node; the pod cannot start until that claim is released (its pod gone), then the kubelet's next try prepares it",
				r.Device, r.Request)}
		}
		if !ok {
			return nil, &busyError{nil, fmt.Errorf("device %s (request %q) is not in the host's network namespace: held by another pod's netns, or gone from the node; "+
				"the pod cannot start until it is back on the host", r.Device, r.Request)}
		}
		rec.Devices = append(rec.Devices, drarecord.Device{
			Request: r.Request, Pool: r.Pool, Device: r.Device,
			PCIAddress: n.PCIAddress, Netdev: n.Netdev, RdmaDevice: n.RdmaDevice,
			Config: &configs[i],
		})
	}
	if err := rdmaNamesFree(rec, b.visible, held); err != nil {
		return nil, err
	}
	if d.CDI != nil && len(rec.Devices) > 0 {
		rec.CDIDir = d.CDI.Path
	}
	if err := d.Records.Write(rec); err != nil {
		return nil, fmt.Errorf("writing the record for the CNI plugin: %w", err)
	}
	if held != nil {
		held.add(rec)
	}
	d.Log.Printf("prepare: claim %s/%s (%s) for pod %s/%s (%s): recorded %s", c.Namespace, c.Name, c.UID,
		rec.PodNamespace, rec.PodName, rec.PodUID, describe(rec.Devices))
	return rec, nil
}

// resolveConfig is what each of the claim's NICs of this driver becomes
// in the pod, from the opaque configuration of this driver its class and
// the claim give (package draconfig), in results' order; attach says
// whether any was given: such a claim gives its NICs to the pod by
// itself, through the "claims" entry of the node's primary network,
// where a claim without one is attached by a NAD's dra mode.
func resolveConfig(c *resourceapi.ResourceClaim, results []resourceapi.DeviceRequestAllocationResult) (nics []draconfig.NIC, attach bool, err error) {
	if len(results) == 0 {
		return nil, false, nil
	}
	var entries []draconfig.Entry
	for _, cfg := range c.Status.Allocation.Devices.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != drarecord.DriverName {
			continue
		}
		src := draconfig.FromClaim
		if cfg.Source == resourceapi.AllocationConfigSourceClass {
			src = draconfig.FromClass
		}
		entries = append(entries, draconfig.Entry{Source: src, Requests: cfg.Requests, Parameters: cfg.Opaque.Parameters.Raw})
	}
	rs := make([]draconfig.Result, len(results))
	for i, r := range results {
		rs[i] = draconfig.Result{Request: r.Request, Device: r.Device}
	}
	nics, err = draconfig.Resolve(entries, rs)
	if err != nil {
		return nil, false, fmt.Errorf("the configuration of %s: %w", drarecord.DriverName, err)
	}
	return nics, len(entries) > 0, nil
}

// rdmaNamesFree refuses an RDMA device name in the pod that another device
// of the node has, on the host or in another claim's pod: RDMA names are
// unique on a node, so the rename would fail at attach, or take the name a
// NIC in another pod must come home under.
func rdmaNamesFree(rec *drarecord.Claim, visible map[string]nics.NIC, held *holders) error {
	for _, dev := range rec.Devices {
		name := dev.Config.RdmaDevName
		if name == "" {
			continue
		}
		taken := false
		for _, n := range visible {
			taken = taken || n.RdmaDevice == name && n.PCIAddress != dev.PCIAddress
		}
		if held != nil {
			taken = taken || held.rdmaNameTaken(rec.ClaimUID, name)
		}
		if taken {
			return fmt.Errorf("rdmaDevName %s (request %q) is taken on this node by another RDMA device: RDMA device names are unique on a node; pick another", config.Quote(name), dev.Request)
		}
	}
	return nil
}

// rdmaNameTaken reports whether a claim other than uid holds a device
// named name on the host or in its pod.
func (h *holders) rdmaNameTaken(uid, name string) bool {
	for _, c := range h.byPCI {
		if c.ClaimUID == uid {
			continue
		}
		for _, d := range c.Devices {
			if d.RdmaDevice == name || d.Config != nil && d.Config.RdmaDevName == name {
				return true
			}
		}
	}
	return false
}

// refuseAdminAccess refuses a claim given a NIC of ours with adminAccess:
// the scheduler gives such a request a device whoever holds it and still
// counts the device free, but a NIC moves into one pod's netns, away from
// the host and from any other pod.
func refuseAdminAccess(results []resourceapi.DeviceRequestAllocationResult) error {
	for _, r := range results {
		if r.AdminAccess != nil && *r.AdminAccess {
			return fmt.Errorf("request %q has device %s with adminAccess; a NIC of %s moves into one pod's network namespace, so it cannot be shared with an admin-access claim: "+
				"read its state from the node instead (rdma-netns doctor, rdma-netns-exporter's metrics), or give the pod a claim of its own without adminAccess",
				r.Request, r.Device, drarecord.DriverName)
		}
	}
	return nil
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

// result tells kubelet which devices were prepared and, for a claim
// prepared with CDI, the CDI device of each, which the kubelet passes to
// the runtime for every container that names the claim. The record says
// which: a claim recorded before CDI was turned on keeps its answer.
func (d *Driver) result(rec *drarecord.Claim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, dev := range rec.Devices {
		kd := kubeletplugin.Device{Requests: []string{dev.Request}, PoolName: dev.Pool, DeviceName: dev.Device, Metadata: d.metadata(rec, dev)}
		if rec.CDIDir != "" {
			kd.CDIDeviceIDs = []string{cdi.ID(rec.ClaimUID, dev.Device)}
		}
		out = append(out, kd)
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
		if err == nil {
			// After the record: a spec left by a stop between the two is
			// swept at the driver's next start.
			err = removeCDI(d.CDI, rec, string(c.UID))
		}
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

// metadata is what the kubelet's device metadata file (mounted in each
// container that names the claim, when main enables it) says of the NIC:
// the attributes the slice publishes, but with its names as the pod has
// them: its RDMA device under its claim's rdmaDevName, and, for a claim
// that attaches its NICs itself, the interface its configuration names
// (also the network data's interface). A NIC a NAD attaches takes the
// name the pod's network selection gives it, unknown here: no netdev.
// So a job builds NCCL_IB_HCA or UCX_NET_DEVICES from the file rather
// than guessing names. Read from the record and the PCI function, both
// there on a Prepare again after the NIC moved into the pod.
func (d *Driver) metadata(rec *drarecord.Claim, dev drarecord.Device) *kubeletplugin.DeviceMetadata {
	n := nics.NIC{PCIAddress: dev.PCIAddress, RdmaDevice: dev.RdmaDevice}
	if c := dev.Config; c != nil {
		if c.RdmaDevName != "" {
			n.RdmaDevice = c.RdmaDevName
		}
		if rec.Attach {
			n.Netdev = c.InterfaceName
		}
	}
	d.Scanner.DescribePCI(&n)
	m := &kubeletplugin.DeviceMetadata{Attributes: map[string]resourceapi.DeviceAttribute{}}
	for k, v := range slices.Attributes(n) {
		m.Attributes[string(k)] = v
	}
	if n.Netdev != "" {
		m.NetworkData = &resourceapi.NetworkDeviceData{InterfaceName: n.Netdev}
	}
	return m
}

// removeCDI removes the claim's CDI specs, from the directory its record
// names and from the driver's own.
func removeCDI(own *cdi.Dir, rec *drarecord.Claim, uid string) error {
	var dirs []string
	if own != nil {
		dirs = append(dirs, own.Path)
	}
	if rec != nil && rec.CDIDir != "" && (own == nil || rec.CDIDir != own.Path) {
		dirs = append(dirs, rec.CDIDir)
	}
	for _, dir := range dirs {
		if err := (cdi.Dir{Path: dir}).Remove(uid); err != nil {
			return fmt.Errorf("removing the claim's CDI specs in %s: %w", dir, err)
		}
	}
	return nil
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
