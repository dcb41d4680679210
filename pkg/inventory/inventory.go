// Package inventory says where every RDMA device on the node is: in the
// host network namespace or in which other one, and which attachment
// record, if any, holds it there. The plugin, `rdma-netns doctor` and the
// exporter all read the node through it, so they agree on one rule.
//
// The rule: the kernel is the truth. In exclusive mode a device in another
// netns is invisible to the host, so a device the host can see is held by
// no pod, whatever a record says. A record is a live claim only while the
// netns it names is still the one recorded at ADD (same nsfs device and
// inode: paths such as /proc/PID/ns/net are reused) and its device is in
// it. Records only remember what the plugin did, so it can be undone.
package inventory

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// NetnsID identifies a network namespace: the device and inode of its nsfs
// file, which is what `ip netns identify` and lsns compare.
type NetnsID struct {
	Dev uint64 `json:"-"`
	Ino uint64 `json:"inode"`
}

// Stat returns the identity of whatever file is at path, without checking
// that it is a network namespace.
func Stat(path string) (NetnsID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return NetnsID{}, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return NetnsID{}, fmt.Errorf("%s: no inode", path)
	}
	return NetnsID{Dev: uint64(st.Dev), Ino: st.Ino}, nil
}

// Identify returns the identity of the network namespace at path, and
// fails for anything that is not one: a /run/netns file left behind
// after its bind mount went away is an empty regular file.
func Identify(path string) (NetnsID, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return NetnsID{}, err
	}
	if st.Type != unix.NSFS_MAGIC {
		return NetnsID{}, fmt.Errorf("%s is not a network namespace", path)
	}
	return Stat(path)
}

// RecordedID is the netns identity a record carries, ok false for records
// written before identities were recorded.
func RecordedID(rec *state.Record) (NetnsID, bool) {
	if rec.NetnsIno == 0 {
		return NetnsID{}, false
	}
	return NetnsID{Dev: rec.NetnsDev, Ino: rec.NetnsIno}, true
}

// SameNetns reports whether the netns at rec.Netns is still the one the
// record was written for. identify resolves a path (Identify in
// production). A record without a recorded identity can only be judged by
// its path still opening a netns.
func SameNetns(rec *state.Record, identify func(string) (NetnsID, error)) (NetnsID, bool) {
	if rec.Netns == "" {
		return NetnsID{}, false
	}
	id, err := identify(rec.Netns)
	if err != nil {
		return NetnsID{}, false
	}
	if want, ok := RecordedID(rec); ok && want != id {
		return id, false
	}
	return id, true
}

// Namespace is one network namespace other than the caller's.
type Namespace struct {
	// Path opens it: the path a record names, else a bind mount under
	// /run/netns, else /proc/PID/ns/net of a process in it.
	Path    string   `json:"path"`
	ID      NetnsID  `json:"id"`
	Devices []string `json:"devices"`
	// Err says why its devices could not be listed.
	Err string `json:"error,omitempty"`
}

// Kernel lists RDMA devices per network namespace.
type Kernel interface {
	// DevicesIn lists the RDMA devices of the netns at nsPath, "" for the
	// caller's own.
	DevicesIn(nsPath string) ([]string, error)
}

// Node is where the scan looks for network namespaces.
type Node struct {
	Kernel Kernel
	// NetnsDirs are where named network namespaces are bind-mounted.
	NetnsDirs []string
	// ProcRoot is "/proc"; Self is the caller's pid, skipped (0 = none).
	ProcRoot string
	Self     int
	// Identify resolves a netns path; nil means Identify.
	Identify func(path string) (NetnsID, error)
}

// RealNode is the running node.
func RealNode(k Kernel) *Node {
	return &Node{Kernel: k, NetnsDirs: []string{"/run/netns", "/var/run/netns"}, ProcRoot: "/proc", Self: os.Getpid()}
}

func (n *Node) identify(path string) (NetnsID, error) {
	if n.Identify != nil {
		return n.Identify(path)
	}
	return Identify(path)
}

// Self identifies the caller's own network namespace.
func (n *Node) SelfID() (NetnsID, error) {
	return n.identify(filepath.Join(n.ProcRoot, "self", "ns", "net"))
}

// Namespaces finds every network namespace on the node except self: those
// at the preferred paths (the ones records name) first, then named ones,
// then those only processes hold. Each appears once, under the first path
// that leads to it.
func (n *Node) Namespaces(self NetnsID, preferred []string) []*Namespace {
	seen := map[NetnsID]bool{self: true}
	var out []*Namespace
	consider := func(path string) {
		id, err := n.identify(path)
		if err != nil || seen[id] {
			return
		}
		seen[id] = true
		out = append(out, &Namespace{Path: path, ID: id, Devices: []string{}})
	}
	for _, p := range preferred {
		consider(p)
	}
	for _, dir := range n.NetnsDirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		names := make([]string, 0, len(entries))
		for _, en := range entries {
			names = append(names, en.Name())
		}
		sort.Strings(names)
		for _, name := range names {
			consider(filepath.Join(dir, name))
		}
	}
	for _, pid := range PIDs(n.ProcRoot, n.Self) {
		consider(filepath.Join(n.ProcRoot, strconv.Itoa(pid), "ns", "net"))
	}
	return out
}

// PIDs lists the numeric entries of procRoot except self, sorted.
func PIDs(procRoot string, self int) []int {
	entries, _ := os.ReadDir(procRoot)
	var pids []int
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 && n != self {
			pids = append(pids, n)
		}
	}
	sort.Ints(pids)
	return pids
}

// Snapshot is where every RDMA device was at one moment.
type Snapshot struct {
	Self NetnsID `json:"self"`
	// Host lists the devices of the caller's netns.
	Host []string `json:"host"`
	// Namespaces are the other namespaces that hold devices, or whose
	// devices could not be listed.
	Namespaces []*Namespace `json:"namespaces"`
}

// Scan lists the devices of the host and of every other netns. Records
// name the paths preferred for their namespaces, so a pod netns is shown
// under the path its runtime gave. A netns that vanishes while we look is
// skipped; one whose devices cannot be listed carries its error.
func (n *Node) Scan(recs []*state.Record) (*Snapshot, error) {
	s, err := n.ScanHost()
	if err != nil {
		return nil, err
	}
	var preferred []string
	for _, r := range recs {
		preferred = append(preferred, r.Netns)
	}
	for _, ns := range n.Namespaces(s.Self, preferred) {
		names, err := n.Kernel.DevicesIn(ns.Path)
		if err != nil {
			if _, gone := n.identify(ns.Path); gone != nil {
				continue
			}
			ns.Err = err.Error()
			s.Namespaces = append(s.Namespaces, ns)
			continue
		}
		if len(names) == 0 {
			continue
		}
		ns.Devices = names
		s.Namespaces = append(s.Namespaces, ns)
	}
	return s, nil
}

// Where finds a device by name: in the host (ns nil, host true), in
// another netns (ns set), or nowhere (both zero).
func (s *Snapshot) Where(name string) (ns *Namespace, host bool) {
	for _, h := range s.Host {
		if h == name {
			return nil, true
		}
	}
	for _, n := range s.Namespaces {
		for _, d := range n.Devices {
			if d == name {
				return n, false
			}
		}
	}
	return nil, false
}

// Verdict is what became of one record's claim on its device.
type Verdict string

const (
	// Held: the device is in the recorded netns; the claim is live.
	Held Verdict = "held"
	// Returned: the device is in the host, so no pod holds it; the record
	// is stale (an interrupted ADD, a netns destroyed without DEL).
	Returned Verdict = "returned"
	// NetnsGone: the recorded netns no longer exists, or its path now
	// opens another one; the kernel has returned its devices.
	NetnsGone Verdict = "netns-gone"
	// Elsewhere: the device is in some other netns; something other than
	// this attachment moved it.
	Elsewhere Verdict = "elsewhere"
	// Missing: no netns on the node has the device.
	Missing Verdict = "missing"
)

// Stale reports whether the verdict leaves the record nothing to hold.
func (v Verdict) Stale() bool { return v == Returned || v == NetnsGone }

// Judge compares one record with the snapshot. where is the netns the
// device was found in (nil for the host or nowhere); identify resolves
// the recorded path (nil means Identify).
func (s *Snapshot) Judge(rec *state.Record, identify func(string) (NetnsID, error)) (v Verdict, where *Namespace) {
	if identify == nil {
		identify = Identify
	}
	id, same := SameNetns(rec, identify)
	names := []string{rec.InPod()}
	if rec.PodName != "" {
		// An ADD or DEL killed between move and rename leaves the host name.
		names = append(names, rec.Device)
	}
	for _, name := range names {
		ns, host := s.Where(name)
		switch {
		case ns != nil && same && ns.ID == id:
			return Held, ns
		case host && !same:
			return NetnsGone, nil
		case host:
			return Returned, nil
		case ns != nil:
			where = ns
		}
	}
	if !same {
		return NetnsGone, where
	}
	if where != nil {
		return Elsewhere, where
	}
	return Missing, nil
}

// Placement is one device, where it is, and the live record holding it.
type Placement struct {
	// Device is its name in its netns (the pod-side name if renamed).
	Device string
	// Netns is nil for the host.
	Netns *Namespace
	// Record is the attachment that put it there, nil if none holds it.
	Record *state.Record
}

// Placements pairs every device of the snapshot with the record that
// holds it, host devices first.
func (s *Snapshot) Placements(recs []*state.Record, identify func(string) (NetnsID, error)) []Placement {
	holder := map[*Namespace]map[string]*state.Record{}
	for _, rec := range recs {
		if v, ns := s.Judge(rec, identify); v == Held {
			if holder[ns] == nil {
				holder[ns] = map[string]*state.Record{}
			}
			holder[ns][rec.InPod()] = rec
			holder[ns][rec.Device] = rec
		}
	}
	var out []Placement
	for _, d := range s.Host {
		out = append(out, Placement{Device: d})
	}
	for _, ns := range s.Namespaces {
		for _, d := range ns.Devices {
			out = append(out, Placement{Device: d, Netns: ns, Record: holder[ns][d]})
		}
	}
	return out
}

// ScanHost lists only the caller's netns: in shared mode every netns sees
// every device, so entering the others says nothing.
func (n *Node) ScanHost() (*Snapshot, error) {
	self, err := n.SelfID()
	if err != nil {
		return nil, fmt.Errorf("cannot identify this process's network namespace: %v", err)
	}
	host, err := n.Kernel.DevicesIn("")
	if err != nil {
		return nil, fmt.Errorf("cannot list the RDMA devices of the host: %w", err)
	}
	return &Snapshot{Self: self, Host: host, Namespaces: []*Namespace{}}, nil
}
