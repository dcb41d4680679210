package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
)

// PCIPlace is where a PCI function sits in the node's topology: its PCIe
// root (the first element of its path under /sys/devices, pci0000:3a, as
// Kubernetes' resource.kubernetes.io/pcieRoot names it) and its NUMA node.
type PCIPlace struct {
	PCIAddress string `json:"pciAddress"`
	// PCIeRoot is "" when the function could not be found.
	PCIeRoot string `json:"pcieRoot"`
	// NUMANode is -1 when the kernel knows none (one-node machines, VMs).
	NUMANode int `json:"numaNode"`
}

// readPCIPlace finds the PCI function addr in the sysfs at root. The
// address must be one sysfs spells: it becomes a path element.
func readPCIPlace(root, addr string) (PCIPlace, error) {
	p := PCIPlace{PCIAddress: addr, NUMANode: -1}
	if !rdmadev.IsPCIAddress(addr) {
		return p, fmt.Errorf("%q is not a PCI address", addr)
	}
	fn, err := filepath.EvalSymlinks(filepath.Join(root, "bus", "pci", "devices", addr))
	if err != nil {
		return p, fmt.Errorf("no PCI function %s on this node: %v", addr, err)
	}
	devices, err := filepath.EvalSymlinks(filepath.Join(root, "devices"))
	if err != nil {
		return p, err
	}
	rel, err := filepath.Rel(devices, fn)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return p, fmt.Errorf("PCI function %s resolves to %s, outside %s", addr, fn, devices)
	}
	p.PCIeRoot, _, _ = strings.Cut(filepath.ToSlash(rel), "/")
	if v, err := readSmall(filepath.Join(fn, "numa_node")); err == nil {
		if n, err := strconv.Atoi(v); err == nil && n >= 0 {
			p.NUMANode = n
		}
	}
	return p, nil
}

// nvidiaMajor is the character major of the NVIDIA driver's /dev/nvidiaN
// nodes; their minor is the GPU's "Device Minor".
const nvidiaMajor = 195

// GPUNode is a GPU's character device as a process of the pod sees it.
type GPUNode struct {
	// Path is the node as the process names it (/dev/nvidia0,
	// /dev/dri/renderD128).
	Path         string
	Major, Minor uint32
}

// gpuNodes lists the GPU nodes in a process's /dev: /dev/nvidia<N> and
// /dev/dri/renderD<N>, character devices only. Symlinks are not followed:
// the pod owns its /dev, and a link would resolve on the node.
func (p Proc) gpuNodes(pid int) []GPUNode {
	dev := filepath.Join(p.Root, strconv.Itoa(pid), "root", "dev")
	var out []GPUNode
	for _, c := range []struct{ dir, prefix string }{{"", "nvidia"}, {"dri", "renderD"}} {
		entries, _ := os.ReadDir(filepath.Join(dev, c.dir))
		for _, e := range entries {
			num, ok := strings.CutPrefix(e.Name(), c.prefix)
			if !ok || !allDigits(num) {
				continue
			}
			major, minor, err := p.charDevice(filepath.Join(dev, c.dir, e.Name()))
			if err != nil {
				continue
			}
			out = append(out, GPUNode{Path: filepath.Join("/dev", c.dir, e.Name()), Major: major, Minor: minor})
		}
	}
	return out
}

func (p Proc) charDevice(path string) (major, minor uint32, err error) {
	if p.CharDev != nil {
		return p.CharDev(path)
	}
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return 0, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return 0, 0, errors.New("not a character device")
	}
	return unix.Major(st.Rdev), unix.Minor(st.Rdev), nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// gpuFunction names the PCI function behind a GPU node. /dev/nvidiaN has
// no device in sysfs: the driver lists its GPUs, with the minor of each,
// under /proc/driver/nvidia/gpus/<PCI address>/information. A DRM render
// node leads to its device through sysfs's dev/char/<major>:<min>/device;
// one that is no PCI function (virtio-gpu, vgem) is no GPU to pair with
// a NIC, and ok is false.
func gpuFunction(procRoot, sysfsRoot string, n GPUNode) (addr string, ok bool, err error) {
	if n.Major == nvidiaMajor {
		addr, err = nvidiaFunction(procRoot, n.Minor)
		return addr, true, err
	}
	fn, err := filepath.EvalSymlinks(filepath.Join(sysfsRoot, "dev", "char", fmt.Sprintf("%d:%d", n.Major, n.Minor), "device"))
	if err != nil || !rdmadev.IsPCIAddress(filepath.Base(fn)) {
		return "", false, nil
	}
	return filepath.Base(fn), true, nil
}

// nvidiaFunction finds the GPU whose "Device Minor" is minor.
func nvidiaFunction(procRoot string, minor uint32) (string, error) {
	dirs, err := os.ReadDir(filepath.Join(procRoot, "driver", "nvidia", "gpus"))
	if err != nil {
		return "", fmt.Errorf("the NVIDIA driver lists no GPU: %v", err)
	}
	for _, d := range dirs {
		if !rdmadev.IsPCIAddress(d.Name()) {
			continue
		}
		info, err := readSmall(filepath.Join(procRoot, "driver", "nvidia", "gpus", d.Name(), "information"))
		if err != nil {
			continue
		}
		if m, ok := nvidiaMinor(info); ok && m == minor {
			return d.Name(), nil
		}
	}
	return "", fmt.Errorf("no GPU in /proc/driver/nvidia/gpus has Device Minor %d", minor)
}

// nvidiaMinor reads the "Device Minor:" line of a GPU's information file.
func nvidiaMinor(info string) (uint32, bool) {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(k) != "Device Minor" {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		return uint32(n), err == nil
	}
	return 0, false
}

// GPU is one GPU of the pod, found through the nodes its processes can
// open or named with --gpus.
type GPU struct {
	PCIPlace
	// FoundBy are its nodes in the pod's /dev, or "--gpus".
	FoundBy []string `json:"foundBy"`
	// Error says why it could not be placed, "" if it was.
	Error string `json:"error,omitempty"`
}

// podGPUs gathers the GPUs the processes pids can open and those named,
// one entry per PCI function (or per node that leads to none), sorted.
func podGPUs(procRoot, sysfsRoot string, p Proc, pids []int, named []string) []GPU {
	byKey := map[string]*GPU{}
	add := func(key, addr, by string, err error) {
		g, ok := byKey[key]
		if !ok {
			g = &GPU{PCIPlace: PCIPlace{PCIAddress: addr, NUMANode: -1}, FoundBy: []string{}}
			byKey[key] = g
		}
		if err != nil && g.Error == "" {
			g.Error = err.Error()
		}
		if slices.Contains(g.FoundBy, by) {
			return
		}
		g.FoundBy = append(g.FoundBy, by)
	}
	for _, pid := range pids {
		for _, n := range p.gpuNodes(pid) {
			addr, ok, err := gpuFunction(procRoot, sysfsRoot, n)
			if !ok {
				continue
			}
			key := addr
			if err != nil {
				key = n.Path
			}
			add(key, addr, n.Path, err)
		}
	}
	for _, addr := range named {
		add(addr, addr, "--gpus", nil)
	}
	out := make([]GPU, 0, len(byKey))
	for _, g := range byKey {
		if g.Error == "" {
			place, err := readPCIPlace(sysfsRoot, g.PCIAddress)
			g.PCIPlace = place
			if err != nil {
				g.Error = err.Error()
			}
		}
		sort.Strings(g.FoundBy)
		out = append(out, *g)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].PCIAddress != out[j].PCIAddress {
			return out[i].PCIAddress < out[j].PCIAddress
		}
		return out[i].FoundBy[0] < out[j].FoundBy[0]
	})
	return out
}

// ParseGPUs reads --gpus: PCI addresses as sysfs spells them, comma
// separated, each once.
func ParseGPUs(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, a := range strings.Split(s, ",") {
		if !rdmadev.IsPCIAddress(a) {
			return nil, fmt.Errorf("%q is not a PCI address as sysfs spells it (domain:bus:device.function in lower-case hex, e.g. 0000:3b:00.0; lspci -D prints them)", a)
		}
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out, nil
}

// NIC is one RDMA device of the pod, its netdevs in the pod, and where its
// PCI function sits.
type NIC struct {
	Device  string   `json:"device"`
	Netdevs []string `json:"netdevs"`
	PCIPlace
	Error string `json:"error,omitempty"`
}

func (n NIC) String() string {
	if len(n.Netdevs) == 0 {
		return fmt.Sprintf("%s (%s)", n.Device, dash(n.PCIAddress))
	}
	return fmt.Sprintf("%s (%s, %s)", strings.Join(n.Netdevs, ","), n.Device, dash(n.PCIAddress))
}

// readNICs places the PCI function of each device in the sysfs at root;
// a device without one (no PCI parent) is left out.
func readNICs(root string, devs []Device) []NIC {
	out := []NIC{}
	for _, d := range devs {
		if d.PCIAddress == "" {
			continue
		}
		n := NIC{Device: d.Name, Netdevs: []string{}}
		for _, p := range d.Ports {
			for _, nd := range p.Netdevs {
				if !slices.Contains(p.NetdevsElsewhere, nd) && !slices.Contains(n.Netdevs, nd) {
					n.Netdevs = append(n.Netdevs, nd)
				}
			}
		}
		var err error
		if n.PCIPlace, err = readPCIPlace(root, d.PCIAddress); err != nil {
			n.Error = err.Error()
		}
		out = append(out, n)
	}
	return out
}
