// Package slices turns the node's NICs into the driver's ResourceSlice
// devices. A NIC a pod holds is invisible on the host (its netdev and
// RDMA device live in the pod's netns), yet it must stay published: the
// scheduler, Multus's DRA client and the next allocation all look it up
// there. So the package keeps the last scan of every NIC on disk and
// publishes a held NIC from it.
package slices

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/rdma-netns/rdma-netns/cmd/rdma-netns-dra/nics"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// Attribute names under the driver's domain, and Multus's (its DRA
// client maps resourceName to a NAD's annotation and passes deviceID).
const (
	AttrNetdev     resourceapi.QualifiedName = drarecord.DriverName + "/netdev"
	AttrRdmaDevice resourceapi.QualifiedName = drarecord.DriverName + "/rdmaDevice"
	AttrLinkLayer  resourceapi.QualifiedName = drarecord.DriverName + "/linkLayer"
	AttrPCIVendor  resourceapi.QualifiedName = drarecord.DriverName + "/pciVendor"
	AttrPCIDevice  resourceapi.QualifiedName = drarecord.DriverName + "/pciDevice"
	AttrMultusID   resourceapi.QualifiedName = "k8s.cni.cncf.io/deviceID"
	AttrMultusName resourceapi.QualifiedName = "k8s.cni.cncf.io/resourceName"
	MultusResource                           = drarecord.DriverName + "/rdma"
	inventoryDir                             = "devices"
	inventoryFile                            = "inventory"
	inventoryPerm                            = 0o600
	// maxInventorySize bounds what Load reads: a node's NICs, a few
	// hundred bytes each.
	maxInventorySize = 4 << 20
)

// DeviceName is the slice's name for the NIC at a PCI address:
// 0000:00:05.0 is pci-0000-00-05-0 (a DNS label, as the API wants).
func DeviceName(pciAddress string) string {
	r := strings.NewReplacer(":", "-", ".", "-")
	return "pci-" + r.Replace(strings.ToLower(pciAddress))
}

// Inventory is what the driver offers: every NIC the last scan saw, plus
// the held NICs of earlier scans, by device name.
type Inventory struct {
	NICs map[string]nics.NIC
	// Held names the devices published from disk, not from this scan.
	Held []string
}

// Lookup finds a device by its slice name.
func (inv *Inventory) Lookup(device string) (nics.NIC, bool) {
	n, ok := inv.NICs[device]
	return n, ok
}

// Store is the last-seen inventory under a record directory, in
// devices/inventory: not a <uid>.json file, so the CNI plugin's reader of
// the records never takes it for a claim.
type Store struct{ Dir drarecord.Dir }

func (s Store) path() string {
	dir := string(s.Dir)
	if dir == "" {
		dir = drarecord.DefaultDir
	}
	return filepath.Join(dir, inventoryDir, inventoryFile)
}

// Load reads the last-seen NICs; none when there is no file yet. It
// reads as the records are read (drarecord.ReadRegular): a FIFO or a link
// in the file's place must fail the round, not block the publisher.
func (s Store) Load() (map[string]nics.NIC, error) {
	b, err := drarecord.ReadRegular(s.path(), maxInventorySize)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]nics.NIC{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the inventory: %v; %s", err, removeIt)
	}
	m := map[string]nics.NIC{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %v; %s", s.path(), err, removeIt)
	}
	return m, nil
}

const removeIt = "remove it and the driver writes it again from the next scan (held NICs stay published from the claims' records)"

// Save replaces the file atomically: a crash mid-write must not lose the
// held NICs.
func (s Store) Save(m map[string]nics.NIC) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path())
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the inventory directory: %w", err)
	}
	return drarecord.ReplaceFile(s.path(), b, inventoryPerm)
}

// Merge combines a scan with the last-seen NICs and the claims' records:
// a NIC absent from the scan stays while some record holds it (from the
// last scan that saw it, or, when none did, from what the record says),
// and is dropped otherwise (unplugged, or its driver unbound). The result
// is what Store should save next.
func Merge(scanned []nics.NIC, last map[string]nics.NIC, records []*drarecord.Claim) *Inventory {
	inv := &Inventory{NICs: map[string]nics.NIC{}}
	for _, n := range scanned {
		inv.NICs[DeviceName(n.PCIAddress)] = n
	}
	for _, c := range records {
		for _, d := range c.Devices {
			name := DeviceName(d.PCIAddress)
			if _, ok := inv.NICs[name]; ok {
				continue
			}
			n, ok := last[name]
			if !ok {
				n = nics.NIC{PCIAddress: d.PCIAddress, Netdev: d.Netdev, RdmaDevice: d.RdmaDevice}
			}
			inv.NICs[name] = n
			inv.Held = append(inv.Held, name)
		}
	}
	sort.Strings(inv.Held)
	return inv
}

// Devices are the slice's devices, sorted by name.
func (inv *Inventory) Devices() []resourceapi.Device {
	names := make([]string, 0, len(inv.NICs))
	for name := range inv.NICs {
		names = append(names, name)
	}
	sort.Strings(names)
	out := make([]resourceapi.Device, 0, len(names))
	for _, name := range names {
		out = append(out, resourceapi.Device{Name: name, Attributes: Attributes(inv.NICs[name])})
	}
	return out
}

// Attributes are the NIC's published attributes; unknown values are left
// out, not published empty, so a selector on them never matches by
// accident. Only what stays put while the NIC moves between the host and
// pods is published: its port state and link speed are not, since a NIC
// back on the host is down (unknown speed) until its next pod brings it
// up, and each change would publish the slice again, have the scheduler
// look at the pool again, and make a selector on them match by timing.
func Attributes(n nics.NIC) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	str := func(name resourceapi.QualifiedName, v string) {
		if v != "" {
			a[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
		}
	}
	if attr, err := deviceattribute.GetPCIBusIDAttribute(n.PCIAddress); err == nil {
		a[attr.Name] = attr.Value
	}
	str(deviceattribute.StandardDeviceAttributePCIeRoot, n.PCIeRoot)
	if n.NUMANode != nil {
		a[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(*n.NUMANode)}
	}
	str(AttrNetdev, n.Netdev)
	str(AttrRdmaDevice, n.RdmaDevice)
	str(AttrLinkLayer, n.LinkLayer)
	str(AttrPCIVendor, n.PCIVendor)
	str(AttrPCIDevice, n.PCIDevice)
	str(AttrMultusID, n.PCIAddress)
	str(AttrMultusName, MultusResource)
	return a
}

// Resources is the node's pool: one slice (a node has far fewer than the
// 128 devices a slice holds). shared is the RDMA subsystem's netns mode
// being shared: then no device is offered at all, since the driver could
// not give a pod a NIC of its own.
func Resources(node string, inv *Inventory, shared bool) resourceslice.DriverResources {
	var devs []resourceapi.Device
	if !shared {
		devs = inv.Devices()
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
}

// Scanner lists the NICs the host sees now.
type Scanner interface {
	Scan() ([]nics.NIC, []nics.Skipped, error)
}

// Refresh scans, merges the held NICs in (Merge) and saves the result as
// the next last-seen inventory. skipped is the scan's, for the log.
func Refresh(sc Scanner, records drarecord.Dir) (inv *Inventory, skipped []nics.Skipped, err error) {
	found, skipped, err := sc.Scan()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the host's RDMA NICs: %w", err)
	}
	store := Store{Dir: records}
	last, err := store.Load()
	if err != nil {
		return nil, nil, err
	}
	recs, _, err := records.List()
	if err != nil {
		return nil, nil, fmt.Errorf("listing the claims' records: %w", err)
	}
	inv = Merge(found, last, recs)
	// A held NIC no scan saw (the inventory file lost) has only what its
	// record says; its PCI function is still in the host and tells the
	// rest that matters for placement (pcieRoot, numaNode).
	if pd, ok := sc.(interface{ DescribePCI(*nics.NIC) }); ok {
		for _, name := range inv.Held {
			if n := inv.NICs[name]; n.PCIeRoot == "" {
				pd.DescribePCI(&n)
				inv.NICs[name] = n
			}
		}
	}
	if err := store.Save(inv.NICs); err != nil {
		return nil, nil, fmt.Errorf("saving the inventory (held NICs would vanish from the slice after a restart): %w", err)
	}
	return inv, skipped, nil
}
