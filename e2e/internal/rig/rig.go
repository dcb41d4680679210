// Package rig holds what the in-VM suites share (e2e's own tests,
// e2e/bench, e2e/stress, e2e/cri and e2e/k8s): the test VM's NIC layout,
// pod network namespaces, running the rdma-netns binary or a libcni chain,
// and checks of where the devices are. It only works inside the test VM
// (see scripts/README.md).
package rig

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/pkg/state"
)

const (
	CNIBinDir = "/opt/cni/bin"
	Plugin    = CNIBinDir + "/rdma-netns"
	StateDir  = "/var/lib/cni/rdma-netns"
	LayoutF   = "/run/rdma-layout"
	RdmaTool  = "/usr/sbin/rdma"
	IPTool    = "/usr/sbin/ip"
)

// NIC is one test NIC and the RDMA device the VM created for it.
type NIC struct {
	Netdev, RDMA, Layout, PCI, ParentBus, Parent string
}

// Layout reads /run/rdma-layout.
func Layout() ([]NIC, error) {
	f, err := os.Open(LayoutF)
	if err != nil {
		return nil, fmt.Errorf("needs the test VM's %s: %v", LayoutF, err)
	}
	defer f.Close()
	var nics []NIC
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		nics = append(nics, NIC{fs[0], fs[1], fs[2], fs[3], fs[4], fs[5]})
	}
	return nics, sc.Err()
}

// Pod is a named network namespace under /run/netns standing in for a pod
// sandbox.
type Pod struct {
	NS ns.NetNS
}

func NewPod() (*Pod, error) {
	n, err := testutils.NewNS()
	if err != nil {
		return nil, fmt.Errorf("create pod netns: %v", err)
	}
	return &Pod{NS: n}, nil
}

func (p *Pod) Path() string { return p.NS.Path() }
func (p *Pod) Name() string { return filepath.Base(p.NS.Path()) }

// Destroy deletes the netns: the kernel returns its physical netdevs and
// RDMA devices to the host, asynchronously.
func (p *Pod) Destroy() error {
	if p == nil || p.NS == nil {
		return nil
	}
	path := p.NS.Path()
	p.NS.Close()
	p.NS = nil
	// MNT_DETACH: testutils.UnmountNS's plain umount fails with EBUSY while
	// any process holds the file open (a sibling goroutine's fork, a plugin
	// still running), which leaves the netns and the devices in it alive.
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %v", path, err)
	}
	return os.Remove(path)
}

// EnsureHostNetns names the host netns "host" for iproute2's
// `rdma dev set DEV netns host`.
func EnsureHostNetns() error {
	if _, err := os.Stat("/run/netns/host"); err == nil {
		return nil
	}
	out, err := exec.Command(IPTool, "netns", "attach", "host", "1").CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip netns attach host 1: %v: %s", err, out)
	}
	return nil
}

// Call is one direct execution of the rdma-netns binary (or of Bin).
type Call struct {
	Bin         string // the CNI plugin to run; default Plugin
	Verb        string
	ContainerID string
	Netns       string
	IfName      string
	Args        string
	Path        string // CNI_PATH; default CNIBinDir
	Stdin       []byte
	Env         []string // replaces the CNI_* environment when set
}

// Run is the outcome of one execution.
type Run struct {
	Stdout, Stderr []byte
	Err            error
	Wall           time.Duration
	MaxRSSKiB      int64
	Killed         bool
}

func (r Run) Failed() bool { return r.Err != nil }

// Msg is what a runtime would report: the CNI error JSON on stdout, or stderr.
func (r Run) Msg() string {
	var e struct {
		Msg     string `json:"msg"`
		Details string `json:"details"`
	}
	if json.Unmarshal(r.Stdout, &e) == nil && e.Msg != "" {
		if e.Details != "" {
			return e.Msg + ": " + e.Details
		}
		return e.Msg
	}
	return strings.TrimSpace(string(r.Stdout) + " " + string(r.Stderr))
}

func (c Call) env() []string {
	if c.Env != nil {
		return c.Env
	}
	path := c.Path
	if path == "" {
		path = CNIBinDir
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "CNI_COMMAND=" + c.Verb, "CNI_PATH=" + path}
	if c.Verb != "VERSION" {
		env = append(env, "CNI_CONTAINERID="+c.ContainerID, "CNI_NETNS="+c.Netns, "CNI_IFNAME="+c.IfName)
		if c.Args != "" {
			env = append(env, "CNI_ARGS="+c.Args)
		}
	}
	return env
}

// Exec runs the plugin and waits for it.
func Exec(c Call) Run { return ExecKill(c, -1) }

// ExecKill runs the plugin and sends it SIGKILL after killAfter (never when
// negative). Killed says whether the signal ended the process.
func ExecKill(c Call, killAfter time.Duration) Run {
	bin := c.Bin
	if bin == "" {
		bin = Plugin
	}
	cmd := exec.Command(bin)
	cmd.Env = c.env()
	cmd.Stdin = bytes.NewReader(c.Stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return Run{Err: err}
	}
	var timer *time.Timer
	if killAfter >= 0 {
		timer = time.AfterFunc(killAfter, func() { cmd.Process.Signal(syscall.SIGKILL) })
	}
	err := cmd.Wait()
	wall := time.Since(start)
	if timer != nil {
		timer.Stop()
	}
	r := Run{Stdout: out.Bytes(), Stderr: errb.Bytes(), Err: err, Wall: wall}
	if ps := cmd.ProcessState; ps != nil {
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			r.MaxRSSKiB = ru.Maxrss
		}
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			r.Killed = true
		}
	}
	return r
}

// PluginConf is the rdma-netns entry as a runtime hands it over, with a
// prevResult naming ifName in the sandbox netnsPath (no prevResult when
// ifName is "").
func PluginConf(network, ifName, netnsPath string, extra map[string]any) []byte {
	conf := map[string]any{"cniVersion": "1.1.0", "name": network, "type": "rdma-netns"}
	if ifName != "" {
		conf["prevResult"] = map[string]any{
			"cniVersion": "1.1.0",
			"interfaces": []map[string]any{{"name": ifName, "sandbox": netnsPath}},
		}
	}
	for k, v := range extra {
		conf[k] = v
	}
	b, _ := json.Marshal(conf)
	return b
}

// Chain builds host-device (moving netdev in as CNI_IFNAME with a static
// address) followed by rdma-netns; rdma nil means host-device alone.
func Chain(name, netdev string, addr int, rdma map[string]any) (*libcni.NetworkConfigList, error) {
	hd := map[string]any{
		"type":   "host-device",
		"device": netdev,
		"ipam": map[string]any{
			"type":      "static",
			"addresses": []map[string]any{{"address": ChainIP(addr) + "/24"}},
		},
	}
	plugins := []map[string]any{hd}
	if rdma != nil {
		p := map[string]any{"type": "rdma-netns"}
		for k, v := range rdma {
			p[k] = v
		}
		plugins = append(plugins, p)
	}
	b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": plugins})
	if err != nil {
		return nil, err
	}
	return libcni.NetworkConfFromBytes(b)
}

// ChainIP is the pod address Chain gives for addr: 10.100.addr/200.x/24,
// so addrs below 200 share one subnet and their pods reach each other over
// the VM's NIC hub.
func ChainIP(addr int) string {
	return fmt.Sprintf("10.100.%d.%d", addr/200, addr%200+2)
}

// CNI returns a libcni runtime with its own result cache.
func CNI(cacheDir string) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{CNIBinDir}, cacheDir, nil)
}

func RT(containerID, netnsPath, ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: containerID, NetNS: netnsPath, IfName: ifName}
}

func AddChain(c *libcni.CNIConfig, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err := c.AddNetworkList(ctx, l, rt)
	return err
}

func DelChain(c *libcni.CNIConfig, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return c.DelNetworkList(ctx, l, rt)
}

// RDMAIn lists the RDMA devices visible in the netns at nsPath ("" = the
// caller's), by netlink dump as `rdma dev` does.
func RDMAIn(nsPath string) ([]string, error) {
	var names []string
	list := func() error {
		for i := 0; ; i++ {
			links, err := netlink.RdmaLinkList()
			if errors.Is(err, netlink.ErrDumpInterrupted) && i < 10 {
				continue
			}
			if err != nil {
				return err
			}
			for _, l := range links {
				names = append(names, l.Attrs.Name)
			}
			return nil
		}
	}
	err := within(nsPath, list)
	sort.Strings(names)
	return names, err
}

// NetdevsIn lists the netdevs of the netns at nsPath ("" = the caller's).
func NetdevsIn(nsPath string) ([]string, error) {
	var names []string
	list := func() error {
		links, err := linkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			names = append(names, l.Attrs().Name)
		}
		return nil
	}
	err := within(nsPath, list)
	sort.Strings(names)
	return names, err
}

// within runs f in the netns at nsPath, or in the caller's when it is "".
func within(nsPath string, f func() error) error {
	if nsPath == "" {
		return f()
	}
	return ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return f() })
}

// linkList retries dumps the kernel marked as interrupted: other pods'
// netdevs move while we read.
func linkList() ([]netlink.Link, error) {
	for i := 0; ; i++ {
		links, err := netlink.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) && i < 10 {
			continue
		}
		return links, err
	}
}

// Records lists the attachment record files in dir.
func Records(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	return out
}

// StateFiles lists every file in dir but the node lock and the device
// locks, which stay for the next call, the names networks reserved, which
// stay by design, and the directory of attachment locks, whose files are
// listed instead: one left over outlives its call.
func StateFiles(dir string) []string {
	entries, _ := os.ReadDir(dir)
	var out []string
	for _, e := range entries {
		switch e.Name() {
		case "lock", state.DeviceLockDir, state.ReservedDir:
		case state.AttachmentLockDir:
			locks, _ := os.ReadDir(filepath.Join(dir, e.Name()))
			for _, l := range locks {
				out = append(out, filepath.Join(e.Name(), l.Name()))
			}
		default:
			out = append(out, e.Name())
		}
	}
	return out
}

func Contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// RestoreNetdevNames gives NICs that came back from a destroyed netns their
// names again (the kernel returns them under the pod's name or devN).
func RestoreNetdevNames(nics []NIC) error {
	links, err := linkList()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nics {
		for _, l := range links {
			a := l.Attrs()
			if a.ParentDev != n.Parent || a.ParentDevBus != n.ParentBus || a.Name == n.Netdev {
				continue
			}
			if err := netlink.LinkSetDown(l); err != nil {
				errs = append(errs, err)
			}
			if err := netlink.LinkSetName(l, n.Netdev); err != nil {
				errs = append(errs, fmt.Errorf("rename %s back to %s: %v", a.Name, n.Netdev, err))
			}
		}
	}
	return errors.Join(errs...)
}

// NICsIn lists the NICs whose netdev is in the netns at nsPath, under
// whatever name it has there.
func NICsIn(nics []NIC, nsPath string) ([]NIC, error) {
	byName, err := NICsByNameIn(nics, nsPath)
	var in []NIC
	for _, n := range nics {
		for _, m := range byName {
			if m == n {
				in = append(in, n)
			}
		}
	}
	return in, err
}

// NICsByNameIn maps the name each NIC's netdev has in the netns at nsPath
// (net1, net2 in a pod) to the NIC.
func NICsByNameIn(nics []NIC, nsPath string) (map[string]NIC, error) {
	in := map[string]NIC{}
	err := within(nsPath, func() error {
		links, err := linkList()
		if err != nil {
			return err
		}
		for _, n := range nics {
			for _, l := range links {
				if a := l.Attrs(); a.ParentDev == n.Parent && a.ParentDevBus == n.ParentBus {
					in[a.Name] = n
				}
			}
		}
		return nil
	})
	return in, err
}

// WaitNetdevsBack waits until the netdev of every NIC of back is in the
// host again, under any name (the kernel returns a destroyed netns's
// netdevs from a work queue), then gives every NIC its name back. It
// returns the NICs still away at the deadline.
func WaitNetdevsBack(nics, back []NIC, timeout time.Duration) ([]NIC, error) {
	deadline := time.Now().Add(timeout)
	for {
		away, err := NICsIn(back, "")
		if err != nil {
			return nil, err
		}
		if len(away) == len(back) || time.Now().After(deadline) {
			var missing []NIC
			for _, n := range back {
				if !slices.ContainsFunc(away, func(h NIC) bool { return h.Parent == n.Parent && h.ParentBus == n.ParentBus }) {
					missing = append(missing, n)
				}
			}
			return missing, RestoreNetdevNames(nics)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Missing reports the NICs whose netdev or RDMA device is not in the host
// under its own name.
func Missing(nics []NIC) ([]string, error) {
	devs, err := RDMAIn("")
	if err != nil {
		return nil, err
	}
	links, err := NetdevsIn("")
	if err != nil {
		return nil, err
	}
	var missing []string
	for _, n := range nics {
		if !Contains(devs, n.RDMA) {
			missing = append(missing, "rdma:"+n.RDMA)
		}
		if !Contains(links, n.Netdev) {
			missing = append(missing, "netdev:"+n.Netdev)
		}
	}
	return missing, nil
}

// WaitHome polls until every NIC is back in the host (renaming returned
// netdevs on the way) or the timeout passes, and returns what is missing.
func WaitHome(nics []NIC, timeout time.Duration) ([]string, error) {
	deadline := time.Now().Add(timeout)
	for {
		RestoreNetdevNames(nics)
		missing, err := Missing(nics)
		if err != nil || len(missing) == 0 || time.Now().After(deadline) {
			return missing, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// HostHas reports whether the host netns lists the RDMA device: a device
// the host can see is held by no pod.
func HostHas(t testing.TB, dev string) bool {
	t.Helper()
	devs, err := RDMAIn("")
	if err != nil {
		t.Fatal(err)
	}
	return Contains(devs, dev)
}

// WaitDevicesHome waits until the host netns lists every one of devs, and
// fails the test, with what the host has, when timeout passes first.
func WaitDevicesHome(t testing.TB, timeout time.Duration, devs ...string) {
	t.Helper()
	var have []string
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		var err error
		if have, err = RDMAIn(""); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(devs, func(d string) bool { return !Contains(have, d) }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v not back in the host netns after %v: the host has %v", devs, timeout, have)
		}
	}
}

// MoveNetdevIn moves a host netdev into the netns at nsPath under its own
// name and sets it up, as host-device would.
func MoveNetdevIn(netdev, nsPath string) error {
	l, err := netlink.LinkByName(netdev)
	if err != nil {
		return err
	}
	target, err := ns.GetNS(nsPath)
	if err != nil {
		return err
	}
	defer target.Close()
	if err := netlink.LinkSetNsFd(l, int(target.Fd())); err != nil {
		return fmt.Errorf("move %s into %s: %v", netdev, nsPath, err)
	}
	return nil
}

// MoveNetdevOut moves a netdev from the netns at nsPath back to the host.
func MoveNetdevOut(netdev, nsPath string) error {
	return ns.WithNetNSPath(nsPath, func(host ns.NetNS) error {
		l, err := netlink.LinkByName(netdev)
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(l, int(host.Fd()))
	})
}

// Stats are the order statistics of a set of durations.
type Stats struct {
	N                     int
	Min, Median, P95, Max time.Duration
	P25, P75              time.Duration
	Mean                  time.Duration
}

func Summarize(ds []time.Duration) Stats {
	if len(ds) == 0 {
		return Stats{}
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	pct := func(p float64) time.Duration {
		i := int(p*float64(len(s)-1) + 0.5)
		return s[i]
	}
	return Stats{N: len(s), Min: s[0], Median: pct(0.5), P95: pct(0.95), Max: s[len(s)-1], P25: pct(0.25), P75: pct(0.75),
		Mean: sum / time.Duration(len(s))}
}

// Ms formats a duration in milliseconds.
func Ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/1e6) }
