package doctor

import (
	"bufio"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/Mellanox/rdmamap"

	"github.com/rdma-netns/rdma-netns/pkg/nssysfs"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
)

// Device is one RDMA device as the doctor saw it.
type Device struct {
	Name string `json:"name"`
	// Driver is the driver bound to the parent device (mlx5_core, ice,
	// virtio-pci...), "" if none.
	Driver string `json:"driver,omitempty"`
	// Parent is the parent device's path under /sys/devices.
	Parent     string `json:"parent,omitempty"`
	PCIAddress string `json:"pciAddress,omitempty"`
	Ports      []Port `json:"ports"`
	// CharDevices are the device's /dev/infiniband nodes (uverbsN, umadN,
	// issmN) and the shared rdma_cm, as the kernel names them;
	// MissingCharDevices those of them absent from the node's /dev.
	CharDevices        []string `json:"charDevices"`
	MissingCharDevices []string `json:"missingCharDevices,omitempty"`
	Location           Location `json:"location"`
}

// Port is one port of an RDMA device.
type Port struct {
	Port      int    `json:"port"`
	State     string `json:"state,omitempty"`
	PhysState string `json:"physState,omitempty"`
	LinkLayer string `json:"linkLayer,omitempty"`
	// Netdevs are the netdevs the port's GID entries belong to.
	Netdevs []string `json:"netdevs"`
	// NetdevsElsewhere are those of Netdevs not in the device's netns.
	NetdevsElsewhere []string `json:"netdevsElsewhere,omitempty"`
	// GIDs counts the non-zero entries of the GID table.
	GIDs int `json:"gids"`
	// IPv4GIDs are the entries derived from IPv4 addresses (::ffff:a.b.c.d).
	IPv4GIDs []GID `json:"ipv4Gids,omitempty"`
}

// GID is one entry of a port's GID table.
type GID struct {
	Index int `json:"index"`
	// Address is the IPv4 address the entry was made for.
	Address string `json:"address"`
	// Type is "RoCE v2" or "IB/RoCE v1"; Netdev the netdev the entry
	// belongs to (gid_attrs).
	Type   string `json:"type,omitempty"`
	Netdev string `json:"netdev,omitempty"`
}

// RoCEv2 is the GID type RoCE v2 (UDP/IP) traffic is sent with.
const RoCEv2 = "RoCE v2"

// Location says which network namespace holds a device.
type Location struct {
	// Host is set for the netns the doctor runs in.
	Host bool `json:"host"`
	// Shared is set in shared mode, where every netns sees every device.
	Shared bool   `json:"shared,omitempty"`
	Netns  string `json:"netns,omitempty"`
	Inode  uint64 `json:"inode,omitempty"`
	// Owner is the attachment (network/container/ifname) whose record
	// claims the device, "" if none.
	Owner string `json:"owner,omitempty"`
}

func (l Location) String() string {
	var s string
	switch {
	case l.Shared:
		s = "every netns (shared mode)"
	case l.Host:
		s = "host"
	case l.Netns != "":
		s = "netns " + l.Netns
	default:
		s = "unknown"
	}
	if l.Owner != "" {
		s += " [" + l.Owner + "]"
	}
	return s
}

// readDevices reads the named RDMA devices (all of them when names is nil)
// from a sysfs mounted in the devices' netns, with devRoot the /dev to
// check character devices against.
func readDevices(root, devRoot string, names []string) ([]Device, error) {
	sys := rdmadev.Sysfs{Root: root}
	listed, err := sys.Devices()
	if err != nil {
		return nil, err
	}
	byName := map[string]rdmadev.Device{}
	for _, d := range listed {
		byName[d.Name] = d
	}
	if names == nil {
		for _, d := range listed {
			names = append(names, d.Name)
		}
	}
	devs := make([]Device, 0, len(names))
	for _, name := range names {
		d := Device{Name: name, Ports: []Port{}, CharDevices: []string{}}
		if rd, ok := byName[name]; ok {
			d.PCIAddress = rd.PCIAddress
			if rd.DevPath != "" {
				if rel, err := filepath.Rel(filepath.Join(root, "devices"), rd.DevPath); err == nil {
					d.Parent = rel
				}
				if t, err := os.Readlink(filepath.Join(rd.DevPath, "driver")); err == nil {
					d.Driver = filepath.Base(t)
				}
			}
			d.Ports = readPorts(root, name)
			d.CharDevices, d.MissingCharDevices = charDevices(root, devRoot, name)
		}
		devs = append(devs, d)
	}
	return devs, nil
}

func readPorts(root, dev string) []Port {
	dir := filepath.Join(root, "class", "infiniband", dev, "ports")
	entries, _ := os.ReadDir(dir)
	ports := []Port{}
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pdir := filepath.Join(dir, e.Name())
		p := Port{Port: n, Netdevs: []string{}}
		p.State = stateName(pdir, "state")
		p.PhysState = stateName(pdir, "phys_state")
		p.LinkLayer, _ = readSmall(filepath.Join(pdir, "link_layer"))
		gids, _ := os.ReadDir(filepath.Join(pdir, "gids"))
		seen := map[string]bool{}
		for _, g := range gids {
			v, err := readSmall(filepath.Join(pdir, "gids", g.Name()))
			if err != nil || zeroGID(v) {
				continue
			}
			p.GIDs++
			nd, err := readSmall(filepath.Join(pdir, "gid_attrs", "ndevs", g.Name()))
			if a, ok := ipv4OfGID(v); ok {
				idx, _ := strconv.Atoi(g.Name())
				typ, _ := readSmall(filepath.Join(pdir, "gid_attrs", "types", g.Name()))
				p.IPv4GIDs = append(p.IPv4GIDs, GID{Index: idx, Address: a.String(), Type: typ, Netdev: nd})
			}
			if err != nil || nd == "" || seen[nd] {
				continue
			}
			seen[nd] = true
			p.Netdevs = append(p.Netdevs, nd)
			// class/net is per netns like class/infiniband: a netdev
			// missing here lives in another netns than the RDMA device.
			if _, err := os.Lstat(filepath.Join(root, "class", "net", nd)); err != nil {
				p.NetdevsElsewhere = append(p.NetdevsElsewhere, nd)
			}
		}
		sort.Strings(p.Netdevs)
		sort.Slice(p.IPv4GIDs, func(i, j int) bool { return p.IPv4GIDs[i].Index < p.IPv4GIDs[j].Index })
		ports = append(ports, p)
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i].Port < ports[j].Port })
	return ports
}

// stateName turns "4: ACTIVE" into "ACTIVE".
func stateName(dir, file string) string {
	v, err := readSmall(filepath.Join(dir, file))
	if err != nil {
		return ""
	}
	if _, after, ok := strings.Cut(v, ":"); ok {
		return strings.TrimSpace(after)
	}
	return v
}

func zeroGID(v string) bool {
	return strings.Trim(v, "0:") == ""
}

// ipv4OfGID is the IPv4 address of an IPv4-mapped GID, as RoCE derives
// one from each IPv4 address of the port's netdev.
func ipv4OfGID(v string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(v)
	if err != nil || !a.Is4In6() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// rdmamap reads package variables; guard them so the paths can point at a
// fixture tree.
var rdmamapMu sync.Mutex

// charDevices asks rdmamap for the device's character devices under the
// sysfs at root and checks that each exists under devRoot. Paths are
// reported as the kernel names them (/dev/infiniband/...).
func charDevices(root, devRoot, name string) (have, missing []string) {
	rdmamapMu.Lock()
	saved := []string{rdmamap.RdmaIbUcmDir, rdmamap.RdmaUmadDir, rdmamap.RdmaUverbsDir, rdmamap.RdmaUcmDevice, rdmamap.RdmaDeviceDir}
	rdmamap.RdmaIbUcmDir = filepath.Join(root, "class", "infiniband_cm")
	rdmamap.RdmaUmadDir = filepath.Join(root, "class", "infiniband_mad")
	rdmamap.RdmaUverbsDir = filepath.Join(root, "class", "infiniband_verbs")
	rdmamap.RdmaUcmDevice = filepath.Join(devRoot, "infiniband", "rdma_cm")
	rdmamap.RdmaDeviceDir = "/dev/infiniband"
	list := rdmamap.GetRdmaCharDevices(name)
	rdmamap.RdmaIbUcmDir, rdmamap.RdmaUmadDir, rdmamap.RdmaUverbsDir, rdmamap.RdmaUcmDevice, rdmamap.RdmaDeviceDir = saved[0], saved[1], saved[2], saved[3], saved[4]
	rdmamapMu.Unlock()

	have = []string{}
	for _, p := range list {
		base := filepath.Base(p)
		canonical := "/dev/infiniband/" + base
		if _, err := os.Stat(filepath.Join(devRoot, "infiniband", base)); err != nil {
			missing = append(missing, canonical)
			continue
		}
		have = append(have, canonical)
	}
	sort.Strings(have)
	return have, missing
}

// hostSysfsIn runs fn with a sysfs that shows the RDMA devices of the
// netns at nsPath ("" = the doctor's own, read at root).
//
// sysfs filters class/infiniband and class/net by the netns that was
// current when it was mounted, so /sys here shows only the host's devices.
// For another netns the doctor mounts a fresh sysfs from inside it, in a
// private mount namespace of one locked thread that is thrown away
// afterwards. Netlink would name the devices too, but GID tables,
// gid_attrs/ndevs and the character device map exist only in sysfs.
func hostSysfsIn(root string) func(nsPath string, fn func(root string) error) error {
	return func(nsPath string, fn func(string) error) error {
		if nsPath == "" {
			return fn(root)
		}
		return nssysfs.In(nsPath, fn)
	}
}

// readSmall reads a small text file, trimmed.
func readSmall(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(bufio.NewReader(f), 64<<10))
	return strings.TrimSpace(string(b)), err
}

func namesOnly(names []string) []Device {
	out := make([]Device, 0, len(names))
	for _, n := range names {
		out = append(out, Device{Name: n, Ports: []Port{}, CharDevices: []string{}})
	}
	return out
}
