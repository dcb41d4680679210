package plugin

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/linkconf"

	"github.com/rdma-netns/rdma-netns/pkg/logging"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev"
	"github.com/rdma-netns/rdma-netns/pkg/rdmadev/sysfstest"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/roceqos"
)

// fakeKernel keeps RDMA devices in memory: where each one is ("" = host,
// else a netns path). It follows the kernel's rules that matter here: names
// are unique system-wide, a device leaves a netns only when asked from
// inside it, and a destroyed netns hands its devices back to the host.
type fakeKernel struct {
	mu      sync.Mutex
	mode    string
	modeErr error
	where   map[string]string
	netdevs []*fakeNetdev
	moves   int
	// index is each device's kernel index, kept across moves and renames;
	// hinted counts the moves that came with the right index as a hint.
	index  map[string]uint32
	hinted int
	// uverbs is each device's verbs node number, made anew at every move
	// into a pod as the kernel does (from the count of moves, so that two
	// moves never give the same one here).
	uverbs map[string]uint32

	qos map[string]roceqos.Settings // device name -> applied settings

	// ports maps a device to the netdev its port is bound to, as RDMA
	// netlink reports it; devices without an entry report "net1".
	ports map[string]string
	// tree and sysParent keep the fake sysfs truthful: a device is listed
	// in class/infiniband only while it is in the host netns.
	tree      *sysfstest.Tree
	sysParent map[string]string

	// Failure and side-effect injection.
	failQoS     error
	failMoveIn  error
	failMoveOut error
	afterMoveIn func()
	// beforeMoveIn runs, without the kernel's lock, as a move into a pod
	// starts: a test holds one call there to run others beside it.
	beforeMoveIn func(dev string)
}

func newFakeKernel(devs ...string) *fakeKernel {
	k := &fakeKernel{mode: rdmans.ModeExclusive, where: map[string]string{}, qos: map[string]roceqos.Settings{},
		ports: map[string]string{}, sysParent: map[string]string{}, index: map[string]uint32{}, uverbs: map[string]uint32{}}
	for _, d := range devs {
		k.where[d] = ""
	}
	return k
}

// indexOf is dev's kernel index, given on first use as the kernel gives
// one at registration. Call with k.mu held.
func (k *fakeKernel) indexOf(dev string) uint32 {
	if _, ok := k.index[dev]; !ok {
		k.index[dev] = uint32(len(k.index)) // the first is 0, as in the kernel
	}
	return k.index[dev]
}

func (k *fakeKernel) NetnsMode() (string, error) { return k.mode, k.modeErr }

func (k *fakeKernel) InHost(dev string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	where, ok := k.where[dev]
	return ok && where == "", nil
}

func (k *fakeKernel) InNetns(nsPath, dev string) (bool, error) {
	if err := checkNetns(nsPath); err != nil {
		return false, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	where, ok := k.where[dev]
	return ok && where == nsPath, nil
}

func (k *fakeKernel) MoveToNetns(dev, nsPath string, hint uint32) (uint32, error) {
	if err := checkNetns(nsPath); err != nil {
		return 0, err
	}
	k.mu.Lock()
	before := k.beforeMoveIn
	k.mu.Unlock()
	if before != nil {
		before(dev)
	}
	k.mu.Lock()
	if k.failMoveIn != nil {
		k.mu.Unlock()
		return 0, k.failMoveIn
	}
	if where, ok := k.where[dev]; !ok || where != "" {
		k.mu.Unlock()
		return 0, fmt.Errorf("RDMA device %s is not in the host network namespace", dev)
	}
	k.where[dev] = nsPath
	delete(k.qos, dev)
	k.moves++
	k.uverbs[dev] = uint32(k.moves)
	index := k.indexOf(dev)
	if hint == index {
		k.hinted++
	}
	k.sync()
	hook := k.afterMoveIn
	k.mu.Unlock()
	if hook != nil {
		hook()
	}
	return index, nil
}

func (k *fakeKernel) VerbsNodesIn(nsPath string) (*rdmans.VerbsNodes, error) {
	if err := checkNetns(nsPath); err != nil {
		return nil, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	out := &rdmans.VerbsNodes{RdmaCM: &rdmans.CharDev{Name: "rdma_cm", Major: 10, Minor: 58}}
	for dev, where := range k.where {
		if where == nsPath {
			n := k.uverbs[dev]
			out.Devices = append(out.Devices, rdmans.VerbsNode{Device: dev, Uverbs: &rdmans.CharDev{Name: fmt.Sprintf("uverbs%d", n), Major: 231, Minor: 192 + n}})
		}
	}
	return out, nil
}

func (k *fakeKernel) MoveToHost(dev, nsPath string) error {
	if err := checkNetns(nsPath); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failMoveOut != nil {
		return k.failMoveOut
	}
	if k.where[dev] != nsPath {
		return fmt.Errorf("RDMA device %s is not in netns %s", dev, nsPath)
	}
	k.where[dev] = ""
	k.moves++
	k.sync()
	return nil
}

// Release is the kernel's answer to rdmans.Release, from the primitives.
func (k *fakeKernel) Release(nsPath, hostName, podName string, nic rdmans.NIC) (bool, rdmans.NICFix, error) {
	found, err := k.releaseRDMA(nsPath, hostName, podName)
	if err != nil || nic.HostName == "" {
		return found, rdmans.NICFix{}, err
	}
	return found, k.restoreNIC(nsPath, nic), nil
}

func (k *fakeKernel) releaseRDMA(nsPath, hostName, podName string) (bool, error) {
	name := hostName
	if podName != "" && podName != hostName {
		if in, err := k.InNetns(nsPath, podName); err != nil {
			return false, err
		} else if in {
			name = podName
		}
	}
	if in, err := k.InNetns(nsPath, name); err != nil || !in {
		return false, err
	}
	if name != hostName {
		if err := k.Rename(nsPath, podName, hostName); err != nil {
			return true, err
		}
	}
	return true, k.MoveToHost(hostName, nsPath)
}

func (k *fakeKernel) Rename(nsPath, from, to string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	where, ok := k.where[from]
	if !ok || where != nsPath {
		return fmt.Errorf("RDMA device %s not found", from)
	}
	if _, taken := k.where[to]; taken {
		return errors.New("file exists")
	}
	delete(k.where, from)
	k.where[to] = where
	k.index[to] = k.indexOf(from)
	delete(k.index, from)
	if n, ok := k.uverbs[from]; ok {
		delete(k.uverbs, from)
		k.uverbs[to] = n
	}
	if p, ok := k.sysParent[from]; ok {
		if k.tree != nil && where == "" {
			k.tree.Remove("infiniband", from)
		}
		delete(k.sysParent, from)
		k.sysParent[to] = p
	}
	if p, ok := k.ports[from]; ok {
		delete(k.ports, from)
		k.ports[to] = p
	}
	k.sync()
	return nil
}

func (k *fakeKernel) DeviceOfNetdev(nsPath, ifName string) (string, error) {
	if err := checkNetns(nsPath); err != nil {
		return "", err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	for dev, where := range k.where {
		port, ok := k.ports[dev]
		if !ok {
			port = "net1"
		}
		if where == nsPath && port == ifName {
			return dev, nil
		}
	}
	return "", nil
}

// sync lists in the fake sysfs exactly the devices in the host netns, as
// the kernel's netns-tagged class directory does. Called with mu held.
func (k *fakeKernel) sync() {
	if k.tree == nil {
		return
	}
	for dev, parent := range k.sysParent {
		where, known := k.where[dev]
		_, err := os.Lstat(filepath.Join(k.tree.Root, "class", "infiniband", dev))
		listed := err == nil
		switch {
		case known && where == "" && !listed:
			k.tree.RDMA(parent, dev)
		case (!known || where != "") && listed:
			k.tree.Remove("infiniband", dev)
		}
	}
}

func (k *fakeKernel) Netdev(nsPath, ifName string) (rdmans.Netdev, error) {
	if err := checkNetns(nsPath); err != nil {
		return rdmans.Netdev{}, err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.link(nsPath, ifName)
	if l == nil {
		return rdmans.Netdev{}, fmt.Errorf("failed to find netdev %s in netns %s", ifName, nsPath)
	}
	return rdmans.Netdev{ParentBus: l.bus, Parent: l.parent, Alias: l.alias}, nil
}

// restoreNIC is rdmans.Netlink.RestoreNIC on the fake's netdevs, which
// link is the NIC decided by rdmans.FindNIC.
func (k *fakeKernel) restoreNIC(nsPath string, nic rdmans.NIC) rdmans.NICFix {
	k.mu.Lock()
	defer k.mu.Unlock()
	var links []*fakeNetdev
	var ids []rdmans.LinkID
	for _, l := range k.netdevs {
		if l.netns == nsPath {
			links = append(links, l)
			ids = append(ids, rdmans.LinkID{Name: l.name, Parent: l.parentID()})
		}
	}
	own, holder := rdmans.FindNIC(ids, nic)
	if own < 0 {
		return rdmans.NICFix{}
	}
	fix := rdmans.NICFix{Found: true}
	l := links[own]
	if l.name != nic.IfName {
		if holder >= 0 {
			aside := links[holder]
			aside.name, aside.up = k.freeName(nsPath, "rn-aside%d"), false
			fix.Aside = aside.name
		}
		fix.Name = l.name
		l.name, l.up = nic.IfName, false
	}
	if l.alias != nic.HostName {
		fix.Realiased, fix.Alias, l.alias = true, l.alias, nic.HostName
	}
	return fix
}

// freeName is the kernel's first free name of pattern in nsPath. Call
// with k.mu held.
func (k *fakeKernel) freeName(nsPath, pattern string) string {
	for i := 0; ; i++ {
		if name := fmt.Sprintf(pattern, i); k.link(nsPath, name) == nil {
			return name
		}
	}
}

// fakeNetdev is a netdev of the fake kernel: the netns it is in ("" the
// host), its name and alias, the device behind it (bus and name, "" for a
// virtual one) and the PCI function host-device finds it by.
type fakeNetdev struct {
	netns, name, alias string
	bus, parent, pci   string
	up                 bool
	// ip is its IP configuration (fakeLinks); a move keeps only the MTU.
	ip  linkconf.Config
	arp *linkconf.ARP
}

func (l *fakeNetdev) parentID() string {
	if l.parent == "" {
		return ""
	}
	return l.bus + "/" + l.parent
}

// addNetdev puts a netdev into the fake kernel.
func (k *fakeKernel) addNetdev(l fakeNetdev) *fakeNetdev {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.netdevs = append(k.netdevs, &l)
	return &l
}

// link is the netdev called name in nsPath, nil if none. Call with k.mu
// held.
func (k *fakeKernel) link(nsPath, name string) *fakeNetdev {
	for _, l := range k.netdevs {
		if l.netns == nsPath && l.name == name {
			return l
		}
	}
	return nil
}

// setLink changes the link called name in nsPath as root in the pod can
// (ip link set ... name/alias/up).
func (k *fakeKernel) setLink(nsPath, name string, change func(l *fakeNetdev)) {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.link(nsPath, name)
	if l == nil {
		panic("no link " + name + " in " + nsPath)
	}
	change(l)
}

// links describes the netdevs in nsPath, sorted: "name[alias]@bus/parent".
func (k *fakeKernel) links(nsPath string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var s []string
	for _, l := range k.netdevs {
		if l.netns == nsPath {
			s = append(s, fmt.Sprintf("%s[%s]@%s", l.name, l.alias, l.parentID()))
		}
	}
	sort.Strings(s)
	return strings.Join(s, " ")
}

// hostDeviceAdd does what host-device's ADD does to the NIC of PCI
// function pci: it moves it from the host into nsPath as ifName, up, with
// its host name in its alias. found is false when the host has no such
// NIC.
func (k *fakeKernel) hostDeviceAdd(pci, nsPath, ifName string) (found bool, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range k.netdevs {
		if l.netns != "" || l.pci != pci {
			continue
		}
		if k.link(nsPath, ifName) != nil {
			return true, fmt.Errorf("failed to move %q (host: %q) to container NS: file exists", ifName, l.name)
		}
		l.netns, l.alias, l.name, l.up = nsPath, l.name, ifName, true
		l.ip = linkconf.Config{MTU: l.ip.MTU}
		return true, nil
	}
	return false, nil
}

// hostDeviceDel does what host-device's DEL does (moveLinkOut): it takes
// the link called ifName out of nsPath, renames it to its alias and moves
// it into the host, down; the host must not have that name already.
func (k *fakeKernel) hostDeviceDel(nsPath, ifName string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	l := k.link(nsPath, ifName)
	switch {
	case l == nil:
		return fmt.Errorf("failed to find %q in containerNS: Link not found", ifName)
	case l.alias == "":
		return fmt.Errorf("failed to find original ifname for %q (alias is not set)", ifName)
	case k.link("", l.alias) != nil:
		return fmt.Errorf("failed to move %q to hostNS: file exists", l.alias)
	}
	l.netns, l.name, l.alias, l.up = "", l.alias, "", false
	l.ip, l.arp = linkconf.Config{MTU: l.ip.MTU}, nil
	return nil
}

func (k *fakeKernel) ApplyQoS(nsPath, dev string, s roceqos.Settings) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.failQoS != nil {
		return k.failQoS
	}
	if k.where[dev] != nsPath {
		return fmt.Errorf("RDMA device %s is not in %s", dev, nsPath)
	}
	k.qos[dev] = s
	return nil
}

func (k *fakeKernel) VerifyQoS(nsPath, dev string, s roceqos.Settings) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	got, ok := k.qos[dev]
	if !ok || fmt.Sprint(deref(got.ToS), deref(got.TC)) != fmt.Sprint(deref(s.ToS), deref(s.TC)) {
		return fmt.Errorf("RoCE type of service of %s port 1 is %v, want %v", dev, deref(got.ToS), deref(s.ToS))
	}
	return nil
}

func (k *fakeKernel) ClearQoS(dev string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.qos, dev)
	return nil
}

func deref(p *int) any {
	if p == nil {
		return nil
	}
	return *p
}

// destroy mimics the kernel tearing down a netns: its devices go home.
func (k *fakeKernel) destroy(nsPath string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for d, w := range k.where {
		if w == nsPath {
			k.where[d] = ""
		}
	}
	// A NIC comes home under its pod-side name, down and bare; a
	// virtual link dies with the netns.
	var kept []*fakeNetdev
	for _, l := range k.netdevs {
		switch {
		case l.netns != nsPath:
			kept = append(kept, l)
		case l.pci != "":
			l.netns, l.up, l.ip, l.arp = "", false, linkconf.Config{MTU: l.ip.MTU}, nil
			kept = append(kept, l)
		}
	}
	k.netdevs = kept
	k.sync()
}

func (k *fakeKernel) location(dev string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	w, ok := k.where[dev]
	if !ok {
		return "<absent>"
	}
	if w == "" {
		return "host"
	}
	return w
}

func (k *fakeKernel) snapshot() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var s []string
	for d, w := range k.where {
		s = append(s, d+"@"+w)
	}
	sort.Strings(s)
	return fmt.Sprint(s)
}

func checkNetns(path string) error {
	n, err := ns.GetNS(path)
	if err != nil {
		return err
	}
	return n.Close()
}

// env is one test's node: a fake sysfs, a fake kernel, a state directory
// and real (empty) network namespaces for the pods.
type env struct {
	t        *testing.T
	tree     *sysfstest.Tree
	kernel   *fakeKernel
	stateDir string
	plugin   *Plugin
	log      *logBuffer
}

type logBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	return len(p), nil
}

func (b *logBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = nil
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// Device paths of the node used by most tests, relative to <sysfs>/devices:
// two virtio NICs as in the e2e VM (RDMA device under the PCI function, and
// under the virtio child), an mlx5 PF with a sub-function, and an E810 with
// irdma named by udev.
const (
	vFn1    = "pci0000:00/0000:00:04.0"
	vChild1 = vFn1 + "/virtio1"
	vFn2    = "pci0000:00/0000:00:05.0"
	vChild2 = vFn2 + "/virtio2"
	mlxPF   = "pci0000:3a/0000:3a:00.0/0000:3b:00.0"
	mlxSF   = mlxPF + "/mlx5_core.sf.2"
	iceFn   = "pci0000:46/0000:46:01.0/0000:47:00.0"
)

func newEnv(t *testing.T) *env {
	t.Helper()
	requireRoot(t)
	tr := sysfstest.New(t)
	tr.Device("", "pci0000:00")
	tr.PCI(vFn1)
	tr.Device("virtio", vChild1)
	tr.Netdev(vChild1, "eth1")
	tr.RDMA(vFn1, "rxe1")
	tr.PCI(vFn2)
	tr.Device("virtio", vChild2)
	tr.Netdev(vChild2, "eth2")
	tr.RDMA(vChild2, "rxe2")
	tr.Device("", "pci0000:3a")
	tr.PCI("pci0000:3a/0000:3a:00.0")
	tr.PCI(mlxPF)
	tr.Netdev(mlxPF, "ens1f0")
	tr.RDMA(mlxPF, "mlx5_0")
	tr.Device("auxiliary", mlxSF)
	tr.Netdev(mlxSF, "enp59s0f0s2")
	tr.RDMA(mlxSF, "mlx5_2")
	tr.Device("", "pci0000:46")
	tr.PCI("pci0000:46/0000:46:01.0")
	tr.PCI(iceFn)
	tr.Device("auxiliary", iceFn+"/ice.roce.0")
	tr.Netdev(iceFn, "ens192")
	tr.RDMA(iceFn, "rocep71s0f0")

	k := newFakeKernel("rxe1", "rxe2", "mlx5_0", "mlx5_2", "rocep71s0f0")
	k.tree = tr
	for dev, parent := range map[string]string{"rxe1": vFn1, "rxe2": vChild2, "mlx5_0": mlxPF, "mlx5_2": mlxSF, "rocep71s0f0": iceFn} {
		k.sysParent[dev] = parent
	}
	e := &env{
		t:        t,
		tree:     tr,
		kernel:   k,
		stateDir: t.TempDir() + "/state",
		log:      &logBuffer{},
	}
	e.plugin = &Plugin{
		Kernel:      e.kernel,
		Sysfs:       rdmadev.Sysfs{Root: tr.Root},
		LockTimeout: 5 * time.Second,
		NewLogger:   func(*config.NetConf, *skel.CmdArgs) *logging.Logger { return logging.NewWriter(e.log, "debug") },
		StateDir:    e.stateDir,
	}
	return e
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces")
	}
}
