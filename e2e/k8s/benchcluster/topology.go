// Package benchcluster is make bench-cluster: a real control plane
// (package cluster) with N kubelet-less nodes of an 8-GPU, 8-NIC server,
// whose slices are what rdma-netns-dra and the stand-in GPU driver
// publish for that server's sysfs, and jobs of pods with conf's claim
// templates scheduled onto them (issue 66).
package benchcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The server every node is: an HGX-like board, 8 GPUs and 8 RDMA NICs on
// 4 PCIe root complexes over 2 NUMA nodes, each root holding one PCIe
// switch with 2 GPUs and 2 NICs below it (the layout GPUDirect RDMA
// wants, and the one conf/dra-claimtemplate-pairs.yaml pairs).
const (
	NICsPerNode = 8
	GPUsPerNode = 8
	// NICVendor, NICDevice: a ConnectX-7; GPUVendor, GPUDevice: an H100.
	NICVendor, NICDevice = "0x15b3", "0x1021"
	GPUVendor, GPUDevice = "0x10de", "0x2330"
)

// roots are the root complexes' bus numbers and NUMA nodes, as a
// two-socket server numbers them.
var roots = []struct {
	bus  int
	numa int
}{{0x15, 0}, {0x37, 0}, {0x97, 1}, {0xb7, 1}}

// Function is a PCI function of the server: a GPU or a NIC.
type Function struct {
	PCIAddress string // 0000:18:00.0
	PCIeRoot   string // pci0000:15
	NUMANode   int
	devPath    string // below <root>/devices
	// A NIC's netdev (ens1f0np0 for NIC 0: the rails template's names)
	// and RDMA device (mlx5_0); empty for a GPU.
	Netdev, RDMA string
}

// Server is one server's sysfs, written under Root.
type Server struct {
	Root string
	NICs []Function
	GPUs []Function
}

// GPUAddresses are the GPUs' PCI addresses, for gpudriver.New.
func (n *Server) GPUAddresses() []string {
	out := make([]string, len(n.GPUs))
	for i, g := range n.GPUs {
		out[i] = g.PCIAddress
	}
	return out
}

// Layout is the server's functions, without writing anything.
func Layout() (nics, gpus []Function) {
	for r, rc := range roots {
		rootDir := fmt.Sprintf("pci0000:%02x", rc.bus)
		port := fmt.Sprintf("0000:%02x:01.0", rc.bus)
		up := fmt.Sprintf("0000:%02x:00.0", rc.bus+1)
		for slot := 0; slot < 4; slot++ {
			down := fmt.Sprintf("0000:%02x:%02x.0", rc.bus+2, slot)
			fn := Function{
				PCIAddress: fmt.Sprintf("0000:%02x:00.0", rc.bus+3+slot),
				PCIeRoot:   rootDir,
				NUMANode:   rc.numa,
			}
			fn.devPath = strings.Join([]string{rootDir, port, up, down, fn.PCIAddress}, "/")
			if slot < 2 {
				gpus = append(gpus, fn)
				continue
			}
			i := 2*r + slot - 2
			fn.Netdev = fmt.Sprintf("ens%df0np0", i+1)
			fn.RDMA = fmt.Sprintf("mlx5_%d", i)
			nics = append(nics, fn)
		}
	}
	return nics, gpus
}

// Write lays the server's sysfs out under root as the kernel does (the
// links pkg/rdmadev/sysfstest makes for the unit tests: class and bus
// links, a class device's `device` and `subsystem`), with the RDMA
// subsystem in exclusive netns mode.
func Write(root string) (*Server, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("sysfs tree %s: %w", abs, err)
	}
	// Resolved, as sysfs code compares resolved paths.
	if abs, err = filepath.EvalSymlinks(abs); err != nil {
		return nil, err
	}
	n := &Server{Root: abs}
	n.NICs, n.GPUs = Layout()
	w := &writer{root: abs}
	for _, fn := range append(append([]Function{}, n.GPUs...), n.NICs...) {
		// The bridges above the function, then the function itself.
		parts := strings.Split(fn.devPath, "/")
		for i := 2; i <= len(parts); i++ {
			w.pci(strings.Join(parts[:i], "/"))
		}
		w.file(w.dev(fn.devPath, "numa_node"), fmt.Sprint(fn.NUMANode))
		vendor, device := GPUVendor, GPUDevice
		if fn.Netdev != "" {
			vendor, device = NICVendor, NICDevice
		}
		w.file(w.dev(fn.devPath, "vendor"), vendor)
		w.file(w.dev(fn.devPath, "device"), device)
	}
	for i := range n.NICs {
		w.err = errors.Join(w.err, n.Plug(i))
	}
	w.file(filepath.Join(abs, "module", "ib_core", "parameters", "netns_mode"), "N")
	if w.err != nil {
		return nil, fmt.Errorf("sysfs tree %s: %w", abs, w.err)
	}
	return n, nil
}

// Unplug takes NIC i's netdev and RDMA device out of the host, as an
// unplugged NIC or one whose driver was unbound: with no claim holding
// it, the driver's next scan drops it from the slice.
func (n *Server) Unplug(i int) error {
	fn := n.NICs[i]
	// The RDMA device first: a scan between the two steps sees an RDMA
	// device without its netdev, which it skips, as after both.
	for _, c := range []struct{ class, name string }{{"infiniband", fn.RDMA}, {"net", fn.Netdev}} {
		link := filepath.Join(n.Root, "class", c.class, c.name)
		if err := os.RemoveAll(filepath.Join(n.Root, "devices", fn.devPath, c.class, c.name)); err != nil {
			return err
		}
		if err := os.Remove(link); err != nil {
			return fmt.Errorf("unplugging NIC %s: %w", fn.PCIAddress, err)
		}
	}
	return nil
}

// Plug puts NIC i's netdev and RDMA device back (Write plugs them all).
func (n *Server) Plug(i int) error {
	fn := n.NICs[i]
	w := &writer{root: n.Root}
	// The netdev first, for the reason Unplug takes it last.
	w.classDevice("net", fn.devPath, fn.Netdev)
	w.file(filepath.Join(n.Root, "class", "net", fn.Netdev, "speed"), "400000")
	w.classDevice("infiniband", fn.devPath, fn.RDMA)
	port := filepath.Join(n.Root, "class", "infiniband", fn.RDMA, "ports", "1")
	w.file(filepath.Join(port, "link_layer"), "Ethernet")
	w.file(filepath.Join(port, "state"), "4: ACTIVE")
	return w.err
}

// writer keeps the first error, so that the layout reads as a list.
type writer struct {
	root string
	err  error
}

func (w *writer) dev(devPath string, rel ...string) string {
	return filepath.Join(append([]string{w.root, "devices", filepath.FromSlash(devPath)}, rel...)...)
}

func (w *writer) mkdir(dir string) {
	if w.err == nil {
		w.err = os.MkdirAll(dir, 0o755)
	}
}

func (w *writer) file(path, data string) {
	w.mkdir(filepath.Dir(path))
	if w.err == nil {
		w.err = os.WriteFile(path, []byte(data+"\n"), 0o644)
	}
}

// symlink makes a relative link, as sysfs's are; a link already there
// (a bridge two functions share) is kept.
func (w *writer) symlink(link, target string) {
	if w.err != nil {
		return
	}
	if _, err := os.Lstat(link); err == nil {
		return
	}
	rel, err := filepath.Rel(filepath.Dir(link), target)
	if err != nil {
		w.err = err
		return
	}
	// The kernel's shape for a class device's `device` link: up past the
	// parent and back down by name.
	if filepath.Base(link) == "device" && rel == filepath.Join("..", "..") {
		rel = filepath.Join("..", "..", "..", filepath.Base(target))
	}
	w.err = os.Symlink(rel, link)
}

// pci makes devPath a PCI function: its subsystem link and the bus's link
// back to it. The root complex itself (pci0000:15) is a plain directory.
func (w *writer) pci(devPath string) {
	dir := w.dev(devPath)
	w.mkdir(dir)
	bus := filepath.Join(w.root, "bus", "pci")
	w.mkdir(filepath.Join(bus, "devices"))
	w.symlink(filepath.Join(dir, "subsystem"), bus)
	w.symlink(filepath.Join(bus, "devices", filepath.Base(dir)), dir)
}

// classDevice makes a class device under its parent, as device_add does.
func (w *writer) classDevice(class, parent, name string) {
	parentDir := w.dev(parent)
	dir := filepath.Join(parentDir, class, name)
	classDir := filepath.Join(w.root, "class", class)
	w.mkdir(dir)
	w.mkdir(classDir)
	w.symlink(filepath.Join(dir, "device"), parentDir)
	w.symlink(filepath.Join(dir, "subsystem"), classDir)
	w.symlink(filepath.Join(classDir, name), dir)
}
