package doctor

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// fakeKernel answers RDMA netlink from a map of netns path -> devices.
type fakeKernel struct {
	mode    string
	modeErr error
	in      map[string][]string
	// uverbs numbers each device's uverbs node; verbsErr fails the
	// question (a kernel without RDMA_NLDEV_CMD_GET_CHARDEV).
	uverbs   map[string]uint32
	verbsErr error
}

// VerbsNodesIn answers for the devices DevicesIn lists, as the kernel
// would from inside that netns.
func (k *fakeKernel) VerbsNodesIn(nsPath string) (*rdmans.VerbsNodes, error) {
	if k.verbsErr != nil {
		return nil, k.verbsErr
	}
	names, err := k.DevicesIn(nsPath)
	if err != nil {
		return nil, err
	}
	v := &rdmans.VerbsNodes{RdmaCM: &rdmans.CharDev{Name: "rdma_cm", Major: 10, Minor: 122}}
	for _, n := range names {
		node := rdmans.VerbsNode{Device: n}
		if i, ok := k.uverbs[n]; ok {
			node.Uverbs = &rdmans.CharDev{Name: fmt.Sprintf("uverbs%d", i), Major: 231, Minor: 192 + i}
		}
		v.Devices = append(v.Devices, node)
	}
	return v, nil
}

func (k *fakeKernel) NetnsMode() (string, error) { return k.mode, k.modeErr }

// DevicesIn finds the netns by inode, as the kernel would whatever path
// leads to it.
func (k *fakeKernel) DevicesIn(nsPath string) ([]string, error) {
	if nsPath == "" {
		return k.in[""], nil
	}
	id, err := inventory.Stat(nsPath)
	if err != nil {
		return nil, err
	}
	for p, d := range k.in {
		if other, err := inventory.Stat(p); p != "" && err == nil && other == id {
			return d, nil
		}
	}
	return []string{}, nil
}

// rdmaFixture adds an RDMA device with one RoCE port to a fake sysfs: its
// state, GIDs (gids non-zero entries on netdev) and uverbs char device.
func rdmaFixture(t *testing.T, tr *sysfstest.Tree, devRoot, parent, name, netdev, state string, gids, uverbs int) {
	t.Helper()
	dir := tr.RDMA(parent, name)
	port := filepath.Join(dir, "ports", "1")
	write(t, filepath.Join(port, "state"), state+"\n")
	write(t, filepath.Join(port, "phys_state"), "5: LinkUp\n")
	write(t, filepath.Join(port, "link_layer"), "Ethernet\n")
	for i := 0; i < 4; i++ {
		gid := "0000:0000:0000:0000:0000:0000:0000:0000"
		if i < gids {
			gid = fmt.Sprintf("fe80:0000:0000:0000:5054:00ff:fe12:340%d", i)
			write(t, filepath.Join(port, "gid_attrs", "ndevs", fmt.Sprint(i)), netdev+"\n")
		}
		write(t, filepath.Join(port, "gids", fmt.Sprint(i)), gid+"\n")
	}
	if uverbs >= 0 {
		write(t, filepath.Join(tr.Root, "class", "infiniband_verbs", fmt.Sprintf("uverbs%d", uverbs), "ibdev"), name+"\n")
		write(t, filepath.Join(devRoot, "infiniband", fmt.Sprintf("uverbs%d", uverbs)), "")
	}
}

type nodeFixture struct {
	env      *Env
	fp       *fakeProc
	kernel   *fakeKernel
	host     *sysfstest.Tree
	pods     map[string]*sysfstest.Tree // netns path -> its sysfs
	store    *state.Store
	netnsDir string
}

// newNodeFixture: three NICs. mlx5_0 is in the host, mlx5_1 in pod-a
// (recorded), mlx5_2 in pod-b (no record: a leak).
func newNodeFixture(t *testing.T) *nodeFixture {
	t.Helper()
	fp := newFakeProc(t)
	devRoot := filepath.Join(t.TempDir(), "dev")
	write(t, filepath.Join(devRoot, "infiniband", "rdma_cm"), "")
	host := sysfstest.New(t)
	host.Device("", "pci0000:00")
	host.PCI("pci0000:00/0000:00:03.0")
	host.Netdev("pci0000:00/0000:00:03.0", "eth0")
	rdmaFixture(t, host, devRoot, "pci0000:00/0000:00:03.0", "mlx5_0", "eth0", "4: ACTIVE", 2, 0)

	netnsDir := filepath.Join(t.TempDir(), "netns")
	f := &nodeFixture{fp: fp, host: host, pods: map[string]*sysfstest.Tree{}, netnsDir: netnsDir}
	// Named netns files are hard links of the fake nsfs inodes, as
	// /run/netns/NAME bind mounts show the same inode as /proc/PID/ns/net.
	podNetns := func(name string) string {
		p := filepath.Join(netnsDir, name)
		mkdir(t, netnsDir)
		if err := os.Link(fp.netns(name), p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	podA, podB := podNetns("pod-a"), podNetns("pod-b")
	for i, p := range []string{podA, podB} {
		tr := sysfstest.New(t)
		fn := fmt.Sprintf("pci0000:00/0000:00:0%d.0", 4+i)
		tr.Device("", "pci0000:00")
		tr.PCI(fn)
		tr.Netdev(fn, "net1")
		rdmaFixture(t, tr, devRoot, fn, fmt.Sprintf("mlx5_%d", i+1), "net1", "4: ACTIVE", 1, i+1)
		f.pods[p] = tr
	}
	fp.proc("1", "systemd", "host", "8388608", "000001ffffffffff", 1<<30)
	fp.proc("40", "pause", "pod-a", "8388608", "00000000a80425fb", 64<<20)
	// /proc/self is the doctor: a link to its pid directory.
	if err := os.Symlink("1", filepath.Join(fp.root, "self")); err != nil {
		t.Fatal(err)
	}

	f.kernel = &fakeKernel{mode: rdmans.ModeExclusive, in: map[string][]string{
		"": {"mlx5_0"}, podA: {"mlx5_1"}, podB: {"mlx5_2"},
	}, uverbs: map[string]uint32{"mlx5_0": 0, "mlx5_1": 1, "mlx5_2": 2, "mlx5_9": 9}}
	stateDir := filepath.Join(t.TempDir(), "state")
	st, err := state.New(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	f.store = st
	f.put(t, "cid-a", podA, "mlx5_1", state.StateAttached)
	etc := t.TempDir()
	f.env = &Env{
		Kernel:    f.kernel,
		SysfsRoot: host.Root,
		SysfsIn: func(nsPath string, fn func(string) error) error {
			if nsPath == "" {
				return fn(host.Root)
			}
			id, err := inventory.Stat(nsPath)
			if err != nil {
				return err
			}
			for p, tr := range f.pods {
				if other, _ := inventory.Stat(p); other == id {
					return fn(tr.Root)
				}
			}
			return errors.New("no sysfs for " + nsPath)
		},
		Proc:      fp.Proc(),
		DevRoot:   devRoot,
		EtcRoot:   etc,
		NetnsDirs: []string{netnsDir},
		StateDir:  stateDir,
		NetnsOf:   inventory.Stat,
	}
	return f
}

func (f *nodeFixture) put(t *testing.T, cid, netns, dev, st string) {
	t.Helper()
	if err := f.store.Put(&state.Record{Key: state.Key{Network: "rdma-net", ContainerID: cid, IfName: "net1"}, Netns: netns, Device: dev, State: st, Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
}

func findingsOf(r *Report, check string) []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

func TestNodeLocationsLeakAndRecords(t *testing.T) {
	f := newNodeFixture(t)
	podA, podB := filepath.Join(f.netnsDir, "pod-a"), filepath.Join(f.netnsDir, "pod-b")
	r := CheckNode(f.env)
	if r.ExitCode != 0 {
		t.Fatalf("exit %d: %+v", r.ExitCode, r.Findings)
	}
	if len(r.Node.Devices) != 3 {
		t.Fatalf("devices %+v", r.Node.Devices)
	}
	want := map[string]Location{
		"mlx5_0": {Host: true},
		"mlx5_1": {Netns: podA, Owner: "rdma-net/cid-a/net1"},
		"mlx5_2": {Netns: podB},
	}
	for _, d := range r.Node.Devices {
		got := d.Location
		got.Inode = 0
		if got != want[d.Name] {
			t.Errorf("%s: location %+v, want %+v", d.Name, got, want[d.Name])
		}
		if len(d.Ports) != 1 || d.Ports[0].State != "ACTIVE" || d.Ports[0].GIDs == 0 || d.PCIAddress == "" {
			t.Errorf("%s: details %+v", d.Name, d)
		}
	}
	d0 := r.Node.Devices[0]
	if d0.Ports[0].GIDs != 2 || strings.Join(d0.Ports[0].Netdevs, ",") != "eth0" || d0.PCIAddress != "0000:00:03.0" {
		t.Errorf("mlx5_0 = %+v", d0)
	}
	if strings.Join(d0.CharDevices, " ") != "/dev/infiniband/rdma_cm /dev/infiniband/uverbs0" {
		t.Errorf("mlx5_0 char devices %v", d0.CharDevices)
	}
	leaks := findingsOf(r, "leak")
	// The fixture's netns directory is not /run/netns: the remedy enters
	// the netns with nsenter.
	if len(leaks) != 1 || leaks[0].Subject != "mlx5_2" || leaks[0].Severity != Warn || !strings.Contains(leaks[0].Remedy, "nsenter --net='"+podB+"' rdma dev set 'mlx5_2' netns host") {
		t.Errorf("leaks %+v", leaks)
	}
	if recs := r.Node.Records; len(recs) != 1 || recs[0].Status != "ok" {
		t.Errorf("records %+v", recs)
	}
	// The pause process's netns is pod-a: found once, under its name.
	if len(r.Node.Namespaces) != 2 || r.Node.Namespaces[0].Path != podA {
		t.Errorf("namespaces %+v", r.Node.Namespaces)
	}
	if p := findingsOf(r, "netns-mode-persistent"); len(p) != 1 || p[0].Severity != Warn {
		t.Errorf("persistence %+v", p)
	}
}

func TestNodeDriftAndStale(t *testing.T) {
	f := newNodeFixture(t)
	podB := filepath.Join(f.netnsDir, "pod-b")
	// mlx5_2 is recorded for a pod whose netns is gone; mlx5_0 is
	// recorded in pod-b but sits in the host.
	f.put(t, "cid-gone", filepath.Join(f.netnsDir, "deleted"), "mlx5_2", state.StateAttached)
	f.put(t, "cid-b", podB, "mlx5_0", state.StateAttached)
	r := CheckNode(f.env)
	if r.ExitCode != 1 {
		t.Fatalf("drift must fail: exit %d", r.ExitCode)
	}
	drift := findingsOf(r, "drift")
	if len(drift) != 1 || drift[0].Subject != "rdma-net/cid-b/net1" || drift[0].Severity != Fail || !strings.Contains(drift[0].Reason, "it is in host") {
		t.Errorf("drift %+v", drift)
	}
	stale := findingsOf(r, "stale-record")
	if len(stale) != 1 || stale[0].Subject != "rdma-net/cid-gone/net1" || !strings.Contains(stale[0].Remedy, f.store.Dir()) {
		t.Errorf("stale %+v", stale)
	}
	// A stale record holds nothing: mlx5_2 in pod-b is a leak.
	if l := findingsOf(r, "leak"); len(l) != 1 || l[0].Subject != "mlx5_2" {
		t.Errorf("leaks %+v", l)
	}
}

func TestClassify(t *testing.T) {
	podA := &inventory.Namespace{Path: "/run/netns/a", ID: inventory.NetnsID{Ino: 10}, Devices: []string{"d-a", "rdma0"}}
	podB := &inventory.Namespace{Path: "/run/netns/b", ID: inventory.NetnsID{Ino: 11}, Devices: []string{"d-b"}}
	snap := &inventory.Snapshot{Host: []string{"d-host"}, Namespaces: []*inventory.Namespace{podA, podB}}
	identify := func(p string) (inventory.NetnsID, error) {
		switch p {
		case "/run/netns/a":
			return podA.ID, nil
		case "/run/netns/b":
			return podB.ID, nil
		}
		return inventory.NetnsID{}, errors.New("no such file")
	}
	rec := func(dev, podName, netns, st string) *state.Record {
		return &state.Record{Key: state.Key{Network: "n", ContainerID: dev, IfName: "net1"}, Device: dev, PodName: podName, Netns: netns, State: st}
	}
	tests := []struct {
		rec    *state.Record
		status string
		sev    Severity
		check  string
		owns   bool
	}{
		{rec("d-a", "", "/run/netns/a", state.StateAttached), "ok", OK, "record", true},
		{rec("d-x", "rdma0", "/run/netns/a", state.StateAttached), "ok", OK, "record", true}, // renamed in the pod
		{rec("d-a", "", "/run/netns/a", state.StateMoving), "moving", Warn, "record", true},
		{rec("d-host", "", "/run/netns/a", state.StateMoving), "moving", Warn, "record", false},
		{rec("d-host", "", "/run/netns/a", state.StateAttached), "drift", Fail, "drift", false},
		{rec("d-b", "", "/run/netns/a", state.StateAttached), "drift", Fail, "drift", false},
		{rec("d-none", "", "/run/netns/a", state.StateAttached), "vanished", Fail, "drift", false},
		{rec("d-host", "", "/run/netns/gone", state.StateAttached), "stale", Warn, "stale-record", false},
		{rec("d-b", "", "/run/netns/gone", state.StateAttached), "stale", Warn, "stale-record", false},
	}
	for _, tt := range tests {
		views, fs, owners := Classify([]*state.Record{tt.rec}, snap, false, identify, func(state.Key) string { return "/state/x.json" })
		if len(views) != 1 || len(fs) != 1 {
			t.Fatalf("%+v: views %+v findings %+v", tt.rec, views, fs)
		}
		if views[0].Status != tt.status || fs[0].Severity != tt.sev || fs[0].Check != tt.check {
			t.Errorf("%s/%s in %s (%s): status %s, %s %s (%s); want %s, %s %s", tt.rec.Device, tt.rec.PodName, tt.rec.Netns, tt.rec.State,
				views[0].Status, fs[0].Severity, fs[0].Check, fs[0].Reason, tt.status, tt.sev, tt.check)
		}
		// Only a live claim holds its device.
		if got := owners[tt.rec.InPod()] == tt.rec; got != tt.owns {
			t.Errorf("%s in %s: owns its device = %v, want %v", tt.rec.Device, tt.rec.Netns, got, tt.owns)
		}
	}

	// Leaks: devices outside the host without a live claim.
	devs := []Device{{Name: "d-host", Location: Location{Host: true}}, {Name: "d-a", Location: Location{Netns: podA.Path}}, {Name: "d-b", Location: Location{Netns: podB.Path}}, {Name: "s", Location: Location{Shared: true}}}
	_, _, owners := Classify([]*state.Record{rec("d-a", "", "/run/netns/a", state.StateAttached), rec("d-b", "", "/run/netns/gone", state.StateAttached)}, snap, false, identify, func(state.Key) string { return "" })
	leaks := Leaks(devs, owners)
	if len(leaks) != 1 || leaks[0].Subject != "d-b" || !strings.Contains(leaks[0].Remedy, "ip netns exec 'b' rdma dev set 'd-b' netns host") {
		t.Errorf("leaks %+v", leaks)
	}
}

func TestPersistentMode(t *testing.T) {
	etc, proc := t.TempDir(), t.TempDir()
	write(t, filepath.Join(proc, "cmdline"), "BOOT_IMAGE=/vmlinuz root=/dev/sda1 quiet\n")
	if where, mode := persistentMode(etc, proc); where != "" || mode != "" {
		t.Fatalf("nothing configured: %q %q", where, mode)
	}
	write(t, filepath.Join(etc, "modprobe.d", "10-rdma.conf"), "# comment\noptions ib_core netns_mode=1\n")
	write(t, filepath.Join(etc, "modprobe.d", "ib_core.conf"), "options ib_core foo=1 netns_mode=0\n")
	write(t, filepath.Join(etc, "modprobe.d", "other.conf.disabled"), "options ib_core netns_mode=1\n")
	if where, mode := persistentMode(etc, proc); where != "/etc/modprobe.d/ib_core.conf" || mode != rdmans.ModeExclusive {
		t.Fatalf("modprobe.d: %q %q", where, mode)
	}
	write(t, filepath.Join(proc, "cmdline"), "root=/dev/sda1 ib_core.netns_mode=1\n")
	if where, mode := persistentMode(etc, proc); where != "kernel command line" || mode != rdmans.ModeShared {
		t.Fatalf("cmdline wins: %q %q", where, mode)
	}
	for v, want := range map[string]string{"0": "exclusive", "N": "exclusive", "n": "exclusive", "1": "shared", "Y": "shared"} {
		if got := boolMode(v); got != want {
			t.Errorf("boolMode(%s) = %s", v, got)
		}
	}
}

func TestNodeModes(t *testing.T) {
	tests := []struct {
		name      string
		mode      string
		err       error
		persisted string
		exit      int
		check     string
		sev       Severity
		reason    string
	}{
		{"no RDMA", "", fmt.Errorf("%w: protocol not supported", rdmans.ErrNoRDMA), "", 1, "rdma-subsystem", Fail, "no RDMA subsystem loaded"},
		{"netlink error", "", errors.New("permission denied"), "", 1, "netns-mode", Fail, "permission denied"},
		{"shared", rdmans.ModeShared, nil, "", 1, "netns-mode", Fail, "shared netns mode"},
		{"shared but configured", rdmans.ModeShared, nil, "0", 1, "netns-mode-persistent", Fail, "has not taken effect"},
		{"exclusive persisted", rdmans.ModeExclusive, nil, "0", 0, "netns-mode-persistent", OK, "survive a reboot"},
		{"exclusive, shared next boot", rdmans.ModeExclusive, nil, "1", 0, "netns-mode-persistent", Warn, "selects shared mode"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newNodeFixture(t)
			f.kernel.mode, f.kernel.modeErr = tt.mode, tt.err
			if tt.persisted != "" {
				write(t, filepath.Join(f.env.EtcRoot, "modprobe.d", "ib_core.conf"), "options ib_core netns_mode="+tt.persisted+"\n")
			}
			r := CheckNode(f.env)
			if r.ExitCode != tt.exit {
				t.Errorf("exit %d, want %d: %+v", r.ExitCode, tt.exit, r.Findings)
			}
			fs := findingsOf(r, tt.check)
			if len(fs) != 1 || fs[0].Severity != tt.sev || !strings.Contains(fs[0].Reason, tt.reason) {
				t.Errorf("%s findings %+v, want one %s mentioning %q", tt.check, fs, tt.sev, tt.reason)
			}
			if tt.sev != OK && fs[0].Remedy == "" {
				t.Errorf("no remedy: %+v", fs[0])
			}
			if tt.mode == rdmans.ModeShared {
				for _, d := range r.Node.Devices {
					if !d.Location.Shared {
						t.Errorf("%s: %+v, want shared", d.Name, d.Location)
					}
				}
				if l := findingsOf(r, "leak"); len(l) != 0 {
					t.Errorf("leaks in shared mode: %+v", l)
				}
			}
		})
	}
}

// A device DEL returned under its pod-side name, its record lost: the
// doctor says so while the host still has it under that name.
func TestNodeLostHostName(t *testing.T) {
	f := newNodeFixture(t)
	if err := f.store.NoteLostName("mlx5_0", "returned RDMA device mlx5_0 without an attachment record: its host name is unknown"); err != nil {
		t.Fatal(err)
	}
	if err := f.store.NoteLostName("gone0", "a device renamed since"); err != nil {
		t.Fatal(err)
	}
	r := CheckNode(f.env)
	lost := findingsOf(r, "lost-host-name")
	if len(lost) != 1 || lost[0].Subject != "mlx5_0" || lost[0].Severity != Warn || !strings.Contains(lost[0].Remedy, "renamed/mlx5_0") {
		t.Fatalf("lost-host-name findings %+v", lost)
	}
}

// The names the plugin reserved on the node are listed, by name, each with
// the network holding it and the file whose deletion releases it, in the
// text (escaped: a network's name is a NAD author's) and in the JSON.
func TestNodeReservations(t *testing.T) {
	f := newNodeFixture(t)
	for name, network := range map[string]string{"rdma_train": "train-net", "rdma_infer": "infer\x1b[2Jnet"} {
		if err := f.store.ReserveName(name, network); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(f.env.StateDir, state.ReservedDir)
	var text, js, stderr bytes.Buffer
	runOn(nil, &text, &stderr, f.env)
	out := text.String()
	table := regexp.MustCompile(`(?m)^RDMA device names reserved\n  NAME +NETWORK +FILE\n  rdma_infer +infer\\x1b\[2Jnet +(\S+)\n  rdma_train +train-net +(\S+)\n`).FindStringSubmatch(out)
	if table == nil || table[1] != filepath.Join(dir, "rdma_infer") || table[2] != filepath.Join(dir, "rdma_train") {
		t.Fatalf("no table of the reserved names, in order, with their files:\n%s", out)
	}
	if strings.Contains(out, "\x1b") {
		t.Errorf("a network's name reaches the terminal unescaped:\n%q", out)
	}

	runOn([]string{"--json"}, &js, &stderr, f.env)
	var got struct {
		Node struct {
			Reservations []struct{ Name, Network, File string } `json:"reservations"`
		} `json:"node"`
	}
	if err := json.Unmarshal(js.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []struct{ Name, Network, File string }{
		{"rdma_infer", "infer\x1b[2Jnet", filepath.Join(dir, "rdma_infer")},
		{"rdma_train", "train-net", filepath.Join(dir, "rdma_train")},
	}
	if !reflect.DeepEqual(got.Node.Reservations, want) {
		t.Errorf("JSON reservations %+v, want %+v", got.Node.Reservations, want)
	}
}

// A node where no network reserved a name says so.
func TestNodeNoReservations(t *testing.T) {
	f := newNodeFixture(t)
	var text, stderr bytes.Buffer
	runOn(nil, &text, &stderr, f.env)
	if !strings.Contains(text.String(), "RDMA device names reserved\n  none\n") {
		t.Errorf("no empty list of reserved names:\n%s", text.String())
	}
}
