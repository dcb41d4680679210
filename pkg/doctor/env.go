package doctor

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

// Kernel is what the doctor asks the running kernel over RDMA netlink.
type Kernel interface {
	NetnsMode() (string, error)
	// DevicesIn lists the RDMA devices of the netns at nsPath, "" for the
	// doctor's own.
	DevicesIn(nsPath string) ([]string, error)
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
	NetnsOf func(path string) (NetnsID, error)
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
		NetnsOf:   nsfsOf,
	}
}

// nsfsOf is NetnsOf for namespace files only.
func nsfsOf(path string) (NetnsID, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return NetnsID{}, err
	}
	if st.Type != unix.NSFS_MAGIC {
		return NetnsID{}, fmt.Errorf("%s is not a network namespace", path)
	}
	return NetnsOf(path)
}

// Netns is one network namespace other than the doctor's own.
type Netns struct {
	// Path opens it: a bind mount under /run/netns when one exists, else
	// /proc/PID/ns/net of a process in it.
	Path    string   `json:"path"`
	Inode   uint64   `json:"inode"`
	Devices []string `json:"devices"`
	Error   string   `json:"error,omitempty"`
	id      NetnsID
}

// namespaces finds every network namespace on the node except self:
// those at the preferred paths (the ones records name) first, then named
// ones, then those only processes hold. Each appears once, under the first
// path that leads to it.
func (e *Env) namespaces(self NetnsID, preferred []string) []*Netns {
	seen := map[NetnsID]bool{self: true}
	var out []*Netns
	consider := func(path string) {
		id, err := e.NetnsOf(path)
		if err != nil || seen[id] {
			return
		}
		seen[id] = true
		out = append(out, &Netns{Path: path, Inode: id.Ino, Devices: []string{}, id: id})
	}
	for _, p := range preferred {
		consider(p)
	}
	for _, dir := range e.NetnsDirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		names := make([]string, 0, len(entries))
		for _, en := range entries {
			names = append(names, en.Name())
		}
		sort.Strings(names)
		for _, n := range names {
			consider(filepath.Join(dir, n))
		}
	}
	for _, pid := range e.Proc.PIDs() {
		consider(e.Proc.NetnsPath(pid))
	}
	return out
}

// selfNetns identifies the doctor's own netns.
func (e *Env) selfNetns() (NetnsID, error) {
	return e.NetnsOf(filepath.Join(e.Proc.Root, "self", "ns", "net"))
}

// netnsExists resolves a recorded netns path.
func (e *Env) netnsExists(path string) (NetnsID, bool) {
	if path == "" {
		return NetnsID{}, false
	}
	id, err := e.NetnsOf(path)
	return id, err == nil
}

func isNoRDMA(err error) bool { return errors.Is(err, rdmans.ErrNoRDMA) }
