package doctor

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
)

// capIPCLock is CAP_IPC_LOCK's bit in the capability sets.
const capIPCLock = 14

// Limit is a resource limit; Unlimited is RLIM_INFINITY.
type Limit struct {
	Bytes     uint64 `json:"bytes"`
	Unlimited bool   `json:"unlimited"`
	// Known is false when the limit could not be read.
	Known bool `json:"known"`
}

func (l Limit) String() string {
	switch {
	case !l.Known:
		return "unknown"
	case l.Unlimited:
		return "unlimited"
	}
	return FormatBytes(l.Bytes)
}

// Sufficient reports whether min bytes fit under the limit.
func (l Limit) Sufficient(min uint64) bool { return l.Unlimited || l.Bytes >= min }

// ParseMemlock reads the soft and hard "Max locked memory" limits from the
// contents of /proc/PID/limits.
func ParseMemlock(limits string) (soft, hard Limit, err error) {
	for _, line := range strings.Split(limits, "\n") {
		rest, ok := strings.CutPrefix(line, "Max locked memory")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			return soft, hard, fmt.Errorf("malformed limits line %q", line)
		}
		if soft, err = parseLimit(f[0]); err != nil {
			return soft, hard, err
		}
		if hard, err = parseLimit(f[1]); err != nil {
			return soft, hard, err
		}
		return soft, hard, nil
	}
	return soft, hard, errors.New(`no "Max locked memory" line`)
}

func parseLimit(s string) (Limit, error) {
	if s == "unlimited" {
		return Limit{Unlimited: true, Known: true}, nil
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return Limit{}, fmt.Errorf("malformed limit %q", s)
	}
	return Limit{Bytes: n, Known: true}, nil
}

// Process is what the pod checks learn about one process in the netns.
type Process struct {
	PID  int    `json:"pid"`
	Comm string `json:"comm"`
	// Memlock is the soft RLIMIT_MEMLOCK, the one ibv_reg_mr is held to.
	Memlock     Limit  `json:"memlock"`
	MemlockHard Limit  `json:"memlockHard"`
	CapIPCLock  bool   `json:"capIpcLock"`
	CapKnown    bool   `json:"capKnown"`
	ShmBytes    uint64 `json:"shmBytes"`
	// ShmErr says why /dev/shm could not be measured, "" if it was.
	ShmErr string `json:"shmError,omitempty"`
	// CharDevices lists /dev/infiniband/* as the process sees it.
	CharDevices []string `json:"charDevices"`
	// Nodes are those of CharDevices the doctor could stat, with their
	// owner and mode; Creds who the process is to the kernel's check of
	// an open of them.
	Nodes []DevNode `json:"nodes,omitempty"`
	Creds Creds     `json:"creds"`
	// Ignored is set for the sandbox's pause process, whose limits do not
	// matter.
	Ignored bool `json:"ignored,omitempty"`
	// UCX is what its environment sets of UCX's rails, nil when it sets
	// no UCX variable.
	UCX *UCXEnv `json:"ucx,omitempty"`
}

// ShmString renders the /dev/shm size for the table.
func (p Process) ShmString() string {
	if p.ShmErr != "" {
		return "unknown"
	}
	return FormatBytes(p.ShmBytes)
}

// Proc reads /proc under Root ("/proc" in production, a fixture in tests).
type Proc struct {
	Root string
	// Statfs measures a file system; nil means statfs(2).
	Statfs func(path string) (uint64, error)
	// CharDev gives the major and minor of a character device node
	// without following a symlink; nil means lstat(2).
	CharDev func(path string) (major, minor uint32, err error)
	// Self is the doctor's own pid, left out of scans (0 = none).
	Self int
}

// PIDs lists the numeric entries of /proc, sorted.
func (p Proc) PIDs() []int { return inventory.PIDs(p.Root, p.Self) }

// NetnsPath is the ns/net file of a process.
func (p Proc) NetnsPath(pid int) string {
	return filepath.Join(p.Root, strconv.Itoa(pid), "ns", "net")
}

// InNetns lists the processes whose netns is id.
func (p Proc) InNetns(id inventory.NetnsID) []int {
	var out []int
	for _, pid := range p.PIDs() {
		if got, err := inventory.Stat(p.NetnsPath(pid)); err == nil && got == id {
			out = append(out, pid)
		}
	}
	return out
}

// Inspect reads one process's limits, capabilities, /dev/shm and RDMA
// character devices, with who may open them. Unreadable parts are left unknown, not fatal: the
// process may exit while we look.
func (p Proc) Inspect(pid int) Process {
	dir := filepath.Join(p.Root, strconv.Itoa(pid))
	pr := Process{PID: pid, CharDevices: []string{}}
	if b, err := os.ReadFile(filepath.Join(dir, "comm")); err == nil {
		pr.Comm = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile(filepath.Join(dir, "limits")); err == nil {
		pr.Memlock, pr.MemlockHard, _ = ParseMemlock(string(b))
	}
	status, statusErr := os.ReadFile(filepath.Join(dir, "status"))
	if statusErr == nil {
		if set, err := ParseCapEff(string(status)); err == nil {
			pr.CapKnown = true
			pr.CapIPCLock = HasCap(set, capIPCLock)
		}
	}
	statfs := p.Statfs
	if statfs == nil {
		statfs = statfsSize
	}
	root := filepath.Join(dir, "root")
	if n, err := statfs(filepath.Join(root, "dev", "shm")); err != nil {
		pr.ShmErr = err.Error()
	} else {
		pr.ShmBytes = n
	}
	if entries, err := os.ReadDir(filepath.Join(root, "dev", "infiniband")); err == nil {
		for _, e := range entries {
			pr.CharDevices = append(pr.CharDevices, e.Name())
		}
	}
	if statusErr == nil {
		pr.Creds, pr.Nodes = inspectCreds(dir, string(status), pr.CharDevices)
	}
	pr.Ignored = pr.Comm == "pause"
	pr.UCX = readUCXEnv(filepath.Join(dir, "environ"))
	return pr
}

// statfsSize is the size of the file system at path. /proc/PID/root
// resolves in the process's mount namespace, so this measures the
// process's own /dev/shm, not ours.
func statfsSize(path string) (uint64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return 0, err
	}
	hi, lo := bits.Mul64(st.Blocks, uint64(st.Bsize))
	if hi != 0 {
		return ^uint64(0), nil
	}
	return lo, nil
}
