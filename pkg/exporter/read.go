package exporter

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/rdma-netns/rdma-netns/pkg/nssysfs"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// NodeReader reads devices from the running kernel.
type NodeReader struct {
	// SysfsRoot is the sysfs of the exporter's own netns ("/sys").
	SysfsRoot string
	// Views keeps each pod netns's sysfs from one scrape to the next; nil
	// mounts a fresh one on every read.
	Views *nssysfs.Views
}

// Read implements Reader. For a netns other than its own it runs on an OS
// thread that joins the netns (nssysfs, on podns's thread rules), and lists
// and reads the devices in that one visit: sysfs shows only the RDMA
// devices and netdevs of the netns it was mounted from, and netlink sockets
// opened on that thread talk to that netns. With Views the thread goes
// back to the exporter's netns afterwards; without, it is thrown away with
// the mount namespace its sysfs is in.
func (r NodeReader) Read(nsPath string) ([]DeviceStats, error) {
	if nsPath == "" {
		return readHere(r.SysfsRoot)
	}
	in := nssysfs.In
	if r.Views != nil {
		in = r.Views.In
	}
	var out []DeviceStats
	err := in(nsPath, func(root string) error {
		var err error
		out, err = readHere(root)
		return err
	})
	return out, err
}

// Sweep lets go of the sysfs views of the namespaces not read since the
// last Sweep: the collector calls it after each scrape.
func (r NodeReader) Sweep() {
	if r.Views != nil {
		r.Views.Sweep()
	}
}

// readHere reads every RDMA device of the calling thread's netns, with
// root a sysfs mounted in it.
func readHere(root string) ([]DeviceStats, error) {
	links, err := rdmans.Links()
	if err != nil {
		return nil, err
	}
	// One dump for every device; a failure only costs the resource counts.
	resources := map[string]map[string]uint64{}
	if res, err := netlink.RdmaResourceList(); err == nil {
		for _, r := range res {
			resources[r.Name] = r.RdmaResourceSummaryEntries
		}
	}
	out := make([]DeviceStats, 0, len(links))
	for _, link := range links {
		name := link.Attrs.Name
		d := DeviceStats{Name: name, Resources: resources[name]}
		ports, err := rdmans.Ports(link.Attrs.Index)
		if err != nil {
			// A kernel that does not answer port queries over RDMA
			// netlink: state and netdev from sysfs instead.
			ports = nil
			for port := uint32(1); port <= link.Attrs.NumPorts; port++ {
				ports = append(ports, sysfsPort(root, name, port))
			}
		}
		for _, p := range ports {
			d.Ports = append(d.Ports, readPort(root, link, p))
		}
		out = append(out, d)
	}
	return out, nil
}

func portDir(root, dev string, port uint32) string {
	return filepath.Join(root, "class", "infiniband", dev, "ports", strconv.Itoa(int(port)))
}

// readPort adds the port's counters: hardware counters over RDMA netlink
// (sysfs hw_counters on kernels without them there) and the standard
// counters, which only sysfs has.
func readPort(root string, link *netlink.RdmaLink, info rdmans.PortInfo) PortStats {
	dir := portDir(root, link.Attrs.Name, info.Port)
	p := PortStats{
		Port:      int(info.Port),
		Netdev:    info.Netdev,
		State:     int(info.State),
		PhysState: int(info.PhysState),
		Counters:  readCounters(filepath.Join(dir, "counters")),
	}
	if st, err := netlink.RdmaPortStatisticList(link, info.Port); err == nil && len(st.Statistics) > 0 {
		p.HWCounters = st.Statistics
	} else {
		p.HWCounters = readCounters(filepath.Join(dir, "hw_counters"))
	}
	return p
}

// sysfsPort reads state and netdev of a port from sysfs.
func sysfsPort(root, dev string, port uint32) rdmans.PortInfo {
	dir := portDir(root, dev, port)
	return rdmans.PortInfo{
		Port:      port,
		State:     uint8(stateNumber(filepath.Join(dir, "state"))),
		PhysState: uint8(stateNumber(filepath.Join(dir, "phys_state"))),
		Netdev:    portNetdev(dir),
	}
}

// portNetdev names the netdev of a RoCE/iWARP port from its GID table.
// The netdev's GIDs fill the first entries (link-local first); looking
// further would read the whole table (1024 files on rxe) of a port whose
// netdev is down and has none.
func portNetdev(portDir string) string {
	ndevs := filepath.Join(portDir, "gid_attrs", "ndevs")
	for i := range 4 {
		if v, err := readSmall(filepath.Join(ndevs, strconv.Itoa(i))); err == nil && v != "" {
			return v
		}
	}
	return ""
}

// stateNumber reads "4: ACTIVE" as 4.
func stateNumber(file string) int {
	v, err := readSmall(file)
	if err != nil {
		return 0
	}
	num, _, _ := strings.Cut(v, ":")
	n, _ := strconv.Atoi(strings.TrimSpace(num))
	return n
}

// readCounters reads a directory of counter files. lifespan (hw_counters)
// is a setting, not a counter, and files that do not read as numbers are
// skipped; a missing directory is no counters.
func readCounters(dir string) map[string]uint64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := map[string]uint64{}
	for _, e := range entries {
		if e.IsDir() || e.Name() == "lifespan" {
			continue
		}
		v, err := readSmall(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			out[e.Name()] = n
		}
	}
	return out
}

func readSmall(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}
