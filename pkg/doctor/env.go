package doctor

import (
	"errors"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Kernel is what the doctor asks the running kernel over RDMA netlink.
type Kernel interface {
	NetnsMode() (string, error)
	// DevicesIn lists the RDMA devices of the netns at nsPath, "" for the
	// doctor's own.
	DevicesIn(nsPath string) ([]string, error)
	// VerbsNodesIn names, from inside the netns at nsPath, the uverbs
	// node of each of its RDMA devices, and rdma_cm.
	VerbsNodesIn(nsPath string) (*rdmans.VerbsNodes, error)
}

type netlinkKernel struct{ rdmans.Netlink }

func (k netlinkKernel) DevicesIn(nsPath string) ([]string, error) {
	if nsPath == "" {
		return k.HostDevices()
	}
	return k.Netlink.DevicesIn(nsPath)
}

// Env is the node the doctor looks at. Production uses the real kernel and
// file systems; tests point the roots at fixture trees.
type Env struct {
	Kernel Kernel
	// SysfsRoot is the sysfs of the doctor's own netns ("/sys").
	SysfsRoot string
	// SysfsIn runs fn with the root of a sysfs showing the netns at nsPath
	// ("" = the doctor's own).
	SysfsIn func(nsPath string, fn func(root string) error) error
	Proc    Proc
	// DevRoot is "/dev"; EtcRoot is "/etc" (for modprobe.d).
	DevRoot, EtcRoot string
	// NetnsDirs are where named network namespaces are bind-mounted.
	NetnsDirs []string
	StateDir  string
	// NetnsOf identifies the netns a path opens and fails for anything
	// that is not one (a netns file left behind after its unmount).
	NetnsOf func(path string) (inventory.NetnsID, error)
	// NRIPluginDir is the runtime's NRI plugin directory, NRILock the
	// NRI plugin's lock file, TaskDir where containerd keeps the bundles
	// (config.json, init.pid) of the running containers of Kubernetes.
	NRIPluginDir, NRILock, TaskDir string
	// NetIn runs fn with the kernel's answers (addresses, ARP sysctls,
	// routes) from inside the netns at nsPath, for the rails check; nil
	// leaves that check out.
	NetIn func(nsPath string, fn func(RailNet) error) error
	// DRADir holds the records of rdma-netns-dra (drarecord.DefaultDir);
	// "" leaves the DRA check out.
	DRADir string
	// CNIConfDir and CNIBinDir are the runtime's CNI configuration and
	// plugin directories, for the claims entry; "" CNIConfDir leaves
	// that check out.
	CNIConfDir, CNIBinDir string
}

// RealEnv is the running node, with sysfs read at sysfsRoot.
func RealEnv(sysfsRoot, stateDir string) *Env {
	return &Env{
		Kernel:    netlinkKernel{},
		SysfsRoot: sysfsRoot,
		SysfsIn:   hostSysfsIn(sysfsRoot),
		Proc:      Proc{Root: "/proc", Self: os.Getpid()},
		DevRoot:   "/dev",
		EtcRoot:   "/etc",
		NetnsDirs: []string{"/run/netns", "/var/run/netns"},
		StateDir:  stateDir,
		NetnsOf:   inventory.Identify,

		NRIPluginDir: "/opt/nri/plugins",
		NRILock:      "/var/run/nri/rdma-netns-nri.lock",
		TaskDir:      "/run/containerd/io.containerd.runtime.v2.task/k8s.io",
		NetIn:        railNetIn,
		CNIConfDir:   "/etc/cni/net.d",
		CNIBinDir:    "/opt/cni/bin",
	}
}

// inventory is the node as pkg/inventory scans it.
func (e *Env) inventory() *inventory.Node {
	return &inventory.Node{Kernel: e.Kernel, NetnsDirs: e.NetnsDirs, ProcRoot: e.Proc.Root, Self: e.Proc.Self, Identify: e.NetnsOf}
}

// persistentMode looks for the netns mode the next boot will use: an
// ib_core option in modprobe.d or on the kernel command line.
func persistentMode(etcRoot, procRoot string) (where, mode string) {
	if cmdline, err := readSmall(filepath.Join(procRoot, "cmdline")); err == nil {
		for _, f := range strings.Fields(cmdline) {
			if v, ok := strings.CutPrefix(f, "ib_core.netns_mode="); ok {
				where, mode = "kernel command line", boolMode(v)
			}
		}
	}
	if where != "" {
		return where, mode
	}
	files, _ := filepath.Glob(filepath.Join(etcRoot, "modprobe.d", "*.conf"))
	sort.Strings(files)
	for _, file := range files {
		data, err := readSmall(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(data, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 || f[0] != "options" || f[1] != "ib_core" {
				continue
			}
			for _, opt := range f[2:] {
				if v, ok := strings.CutPrefix(opt, "netns_mode="); ok {
					// Later files override earlier ones, as modprobe reads them.
					where, mode = "/etc/modprobe.d/"+filepath.Base(file), boolMode(v)
				}
			}
		}
	}
	return where, mode
}

// boolMode maps ib_core's netns_mode (a bool: shared when true) to a mode.
func boolMode(v string) string {
	switch strings.ToLower(v) {
	case "0", "n", "no", "false", "off":
		return rdmans.ModeExclusive
	}
	return rdmans.ModeShared
}

// records reads the state store without creating it: a node where
// rdma-netns never ran has no directory, and the doctor changes nothing.
// damaged lists unreadable record files, moved aside or not yet.
func (e *Env) records() (recs []*state.Record, damaged []string, err error) {
	st, err := state.Open(e.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	recs, listErr := st.List()
	damaged = state.CorruptPaths(listErr)
	if len(damaged) == 0 && listErr != nil {
		return recs, nil, listErr
	}
	aside, err := st.Damaged()
	return recs, append(damaged, aside...), err
}

// Reservation is an RDMA device name reserved on the node for the network
// whose configuration gives its pods that name (rdmaDevName): no pod
// may give its device that name itself (podRdmaDevNamePrefix). The
// plugin writes it at the network's first attachment on the node and
// never removes it.
type Reservation struct {
	Name    string `json:"name"`
	Network string `json:"network"`
	// File holds it; deleting the file releases the name.
	File string `json:"file"`
}

// reservations reads the node's name reservations, by name, without
// creating the state directory.
func (e *Env) reservations() ([]Reservation, error) {
	out := []Reservation{}
	st, err := state.Open(e.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	names, err := st.ReservedNames()
	for name, network := range names {
		out = append(out, Reservation{Name: name, Network: network, File: filepath.Join(st.Dir(), state.ReservedDir, name)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

func (e *Env) recordFile(k state.Key) string {
	st, err := state.Open(e.StateDir)
	if err != nil {
		return e.StateDir
	}
	return st.Path(k)
}
