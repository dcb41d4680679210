// Package nics inventories the node's RDMA NICs from sysfs: the PCI
// functions that have both an RDMA device and a netdev in the host's
// network namespace, which is what the driver can hand to a pod.
package nics

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// NIC is one RDMA-capable PCI function as the host saw it. It is stored
// on disk (the last-seen inventory), so its fields keep their JSON names.
type NIC struct {
	// PCIAddress is the function's address as sysfs spells it
	// (0000:00:05.0): the device's identity.
	PCIAddress string `json:"pciAddress"`
	Netdev     string `json:"netdev"`
	RdmaDevice string `json:"rdmaDevice"`
	// LinkLayer and PortState are port 1's ("Ethernet", "ACTIVE"); ""
	// when sysfs did not say.
	LinkLayer string `json:"linkLayer,omitempty"`
	PortState string `json:"portState,omitempty"`
	// SpeedMbps is the netdev's speed; 0 when the driver does not know it
	// (virtio reports -1, a link that is down reports nothing).
	SpeedMbps int64  `json:"speedMbps,omitempty"`
	PCIVendor string `json:"pciVendor,omitempty"`
	PCIDevice string `json:"pciDevice,omitempty"`
	// PCIeRoot is the root complex (pci0000:00); NUMANode is nil when the
	// kernel gives the function no NUMA affinity (numa_node -1).
	PCIeRoot string `json:"pcieRoot,omitempty"`
	NUMANode *int64 `json:"numaNode,omitempty"`
}

// Skipped is a PCI function with an RDMA device that is not offered, and
// why, for the log.
type Skipped struct {
	PCIAddress string
	RdmaDevice string
	Reason     string
}

// Scanner reads the sysfs mounted at Root ("/sys"; tests give a fake tree).
type Scanner struct {
	Root string
	// Only, when not empty, are the PCI functions offered: the others are
	// left to whatever else hands NICs out on the node (a device plugin,
	// NADs that name their NIC), which must never hand out the same one.
	Only map[string]bool
}

// Scan lists the host's RDMA NICs, sorted by PCI address. RDMA devices
// not on a PCI function, or whose function has no netdev in the host,
// come back in skipped: a pod needs both, and an RDMA device without its
// netdev is usually one a pod already holds half of.
func (s Scanner) Scan() (nics []NIC, skipped []Skipped, err error) {
	fs := rdmadev.Sysfs{Root: s.Root}
	devs, err := fs.Devices()
	if err != nil {
		return nil, nil, err
	}
	byFunc := map[string][]string{}
	for _, d := range devs {
		if d.PCIAddress == "" {
			skipped = append(skipped, Skipped{RdmaDevice: d.Name, Reason: "not on a PCI function"})
			continue
		}
		byFunc[d.PCIAddress] = append(byFunc[d.PCIAddress], d.Name)
	}
	addrs := make([]string, 0, len(byFunc))
	for a := range byFunc {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	for _, addr := range addrs {
		if len(s.Only) > 0 && !s.Only[addr] {
			skipped = append(skipped, Skipped{PCIAddress: addr, RdmaDevice: strings.Join(byFunc[addr], ","), Reason: "not in --pci-addresses"})
			continue
		}
		n, why := s.nic(fs, addr, devs)
		if why != "" {
			skipped = append(skipped, Skipped{PCIAddress: addr, RdmaDevice: strings.Join(byFunc[addr], ","), Reason: why})
			continue
		}
		nics = append(nics, n)
	}
	return nics, skipped, nil
}

// nic pairs the function's netdev with its RDMA device the way the CNI
// plugin does (rdmadev.Closest from the netdev's parent), so the driver
// and the plugin agree on which RDMA device goes with the NIC. why says
// what is missing when there is no pair.
func (s Scanner) nic(fs rdmadev.Sysfs, addr string, devs []rdmadev.Device) (NIC, string) {
	fn, err := fs.BusDevicePath("pci", addr)
	if err != nil {
		return NIC{}, err.Error()
	}
	netdevs := netdevsOf(fn)
	if len(netdevs) == 0 {
		return NIC{}, "no netdev in the host's netns (held by a pod, or its driver makes none)"
	}
	for _, nd := range netdevs {
		m := rdmadev.Closest(nd.parent, addr, devs)
		if len(m) != 1 {
			continue
		}
		n := NIC{PCIAddress: addr, Netdev: nd.name, RdmaDevice: m[0].Device.Name}
		s.describe(&n, fn)
		return n, ""
	}
	return NIC{}, fmt.Sprintf("no netdev of %s has exactly one nearest RDMA device", addr)
}

type netdev struct{ name, parent string }

// netdevsOf finds the function's netdevs: under its own net/ (mlx5,
// irdma) or under a virtio child's (virtio-net, where rxe hangs its RDMA
// device off the netdev's parent or the function). Sorted by name.
func netdevsOf(fn string) []netdev {
	var out []netdev
	parents := []string{fn}
	if vs, err := filepath.Glob(filepath.Join(fn, "virtio*")); err == nil {
		parents = append(parents, vs...)
	}
	for _, p := range parents {
		ents, err := os.ReadDir(filepath.Join(p, "net"))
		if err != nil {
			continue
		}
		for _, e := range ents {
			out = append(out, netdev{name: e.Name(), parent: p})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// describe fills what the slice publishes about the NIC. Each value is
// optional: a file sysfs lacks leaves its attribute out rather than
// hiding the NIC.
func (s Scanner) describe(n *NIC, fn string) {
	port := filepath.Join(s.Root, "class", "infiniband", n.RdmaDevice, "ports", "1")
	n.LinkLayer = readLine(filepath.Join(port, "link_layer"))
	// "4: ACTIVE": the name is what a reader of the slice knows.
	state := readLine(filepath.Join(port, "state"))
	if _, name, ok := strings.Cut(state, ": "); ok {
		state = name
	}
	n.PortState = state
	if v, err := strconv.ParseInt(readLine(filepath.Join(s.Root, "class", "net", n.Netdev, "speed")), 10, 64); err == nil && v > 0 {
		n.SpeedMbps = v
	}
	s.describePCI(n, fn)
}

// DescribePCI fills what the PCI function says about the NIC. The
// function stays in the host when a pod takes the NIC's netdev and RDMA
// device, so this works for a held NIC too.
func (s Scanner) DescribePCI(n *NIC) {
	fn, err := rdmadev.Sysfs{Root: s.Root}.BusDevicePath("pci", n.PCIAddress)
	if err != nil {
		return
	}
	s.describePCI(n, fn)
}

func (s Scanner) describePCI(n *NIC, fn string) {
	n.PCIVendor = readLine(filepath.Join(fn, "vendor"))
	n.PCIDevice = readLine(filepath.Join(fn, "device"))
	mod := deviceattribute.WithFSFromRoot(s.Root)
	if a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(n.PCIAddress, mod); err == nil && a.Value.StringValue != nil {
		n.PCIeRoot = *a.Value.StringValue
	}
	// An error here is the kernel's numa_node -1 (or no such file): the
	// attribute is then left out, as the standard asks.
	if a, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(n.PCIAddress, deviceattribute.ScalarAttribute, mod); err == nil && a.Value.IntValue != nil {
		v := *a.Value.IntValue
		n.NUMANode = &v
	}
}

func readLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
