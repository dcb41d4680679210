//go:build e2e

// Package e2e runs rdma-netns for real: inside the test VM (see scripts/),
// against the kernel's RDMA subsystem, the real host-device and static
// plugins, and libcni executing the chains as container runtimes do.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

const (
	cniBinDir = "/opt/cni/bin"
	stateDir  = "/var/lib/cni/rdma-netns"
	// In the node's log directory, the only place rdma-netns writes one.
	logFile   = "/var/log/rdma-netns/e2e.log"
	layoutEnv = "/run/rdma-layout"
)

// nic is one test NIC and the RDMA device the VM created for it.
type nic = rig.NIC

var nics []nic

func TestMain(m *testing.M) {
	var err error
	if nics, err = rig.Layout(); err != nil || len(nics) < 4 {
		fmt.Fprintf(os.Stderr, "e2e: needs the test VM's %s with at least 4 NICs (got %d, %v); run `make e2e`\n", layoutEnv, len(nics), err)
		os.Exit(2)
	}
	code := m.Run()
	// Whatever the tests did, the node must end as it started.
	if err := allHome(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: end-of-suite check: %v\n", err)
		code = 1
	} else {
		fmt.Println("e2e: end-of-suite check: every RDMA device and netdev is back in the host, no state left")
	}
	os.Exit(code)
}

// allHome checks the end state of the node: every NIC and RDMA device in
// the host netns under its own name and no attachment records.
func allHome() error {
	devs, err := rdmaDevs("")
	if err != nil {
		return err
	}
	links, err := netdevs("")
	if err != nil {
		return err
	}
	var missing []string
	for _, n := range nics {
		if !contains(devs, n.RDMA) {
			missing = append(missing, "RDMA "+n.RDMA)
		}
		if !contains(links, n.Netdev) {
			missing = append(missing, "netdev "+n.Netdev)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("not in the host: %s (host RDMA: %v)", strings.Join(missing, ", "), devs)
	}
	if recs := records(); len(recs) > 0 {
		return fmt.Errorf("state records left: %v", recs)
	}
	return nil
}

// helperProcess is the body of a test that is not one: the process a test
// of the named tests starts in a pod with env set to the kind of workload
// to become. Run as a test (env unset), it skips.
func helperProcess(t *testing.T, env, tests string, become func(kind string) error) {
	kind := os.Getenv(env)
	if kind == "" {
		t.Skip("helper process for the " + tests + " tests")
	}
	if err := become(kind); err != nil {
		fmt.Fprintf(os.Stderr, "workload: %v\n", err)
		os.Exit(1)
	}
}

func records() []string { return rig.Records(stateDir) }

func contains(list []string, s string) bool { return rig.Contains(list, s) }

// nicBy returns the first NIC with the given layout ("pf", "child") or,
// for "udev", the one whose RDMA device has a udev-style name.
func nicBy(t *testing.T, layout string) nic {
	t.Helper()
	for _, n := range nics {
		switch {
		case layout == "udev" && strings.HasPrefix(n.RDMA, "rocep"):
			return n
		case layout != "udev" && n.Layout == layout && !strings.HasPrefix(n.RDMA, "rocep"):
			return n
		}
	}
	t.Fatalf("the VM has no NIC with layout %s", layout)
	return nic{}
}

// pod is a network namespace standing in for a pod sandbox.
type pod struct {
	t  *testing.T
	ns ns.NetNS
	id string
}

func newPod(t *testing.T, id string) *pod {
	t.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create pod netns: %v", err)
	}
	p := &pod{t: t, ns: n, id: id}
	t.Cleanup(func() { p.destroy() })
	return p
}

func (p *pod) path() string { return p.ns.Path() }

// destroy deletes the netns; the kernel returns its physical netdevs and
// RDMA devices to the host.
func (p *pod) destroy() {
	if p.ns == nil {
		return
	}
	held, err := rig.NICsIn(nics, p.path())
	if err != nil {
		p.t.Error(err)
	}
	p.ns.Close()
	testutils.UnmountNS(p.ns)
	p.ns = nil
	// The kernel returns devices asynchronously (netns cleanup runs in a
	// workqueue): wait for the pod's netdevs, however loaded the machine,
	// so later steps and tests see them under their names.
	missing, err := rig.WaitNetdevsBack(nics, held, 10*time.Second)
	if err != nil {
		p.t.Error(err)
	}
	for _, n := range missing {
		p.t.Errorf("netdev of %s did not come back from the destroyed pod netns within 10s", n.Netdev)
	}
}

// restoreNetdevNames gives NICs that came back from a destroyed netns their
// names again: the kernel returns them under the pod's name (net1) or, on a
// clash, devN, as it does on real nodes.
func restoreNetdevNames(t *testing.T) {
	t.Helper()
	if err := rig.RestoreNetdevNames(nics); err != nil {
		t.Error(err)
	}
}

func (p *pod) rt(ifName string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: p.id, NetNS: p.path(), IfName: ifName}
}

// rdmaDevs is what iproute2's `rdma dev` shows in a netns ("" = host).
func rdmaDevs(nsPath string) ([]string, error) {
	out, err := inNetns(nsPath, rdmaTool(), "-j", "dev", "show")
	if err != nil {
		return nil, err
	}
	var devs []struct {
		Name string `json:"ifname"`
	}
	if err := json.Unmarshal(out, &devs); err != nil {
		return nil, fmt.Errorf("parse `rdma -j dev`: %v: %s", err, out)
	}
	var names []string
	for _, d := range devs {
		names = append(names, d.Name)
	}
	sort.Strings(names)
	return names, nil
}

// rdmaLinkNetdev is the netdev `rdma link` shows on the device's port 1.
func rdmaLinkNetdev(nsPath, dev string) (string, error) {
	out, err := inNetns(nsPath, rdmaTool(), "-j", "link", "show", dev+"/1")
	if err != nil {
		return "", err
	}
	var links []struct {
		Netdev string `json:"netdev"`
	}
	if err := json.Unmarshal(out, &links); err != nil || len(links) != 1 {
		return "", fmt.Errorf("parse `rdma -j link`: %v: %s", err, out)
	}
	return links[0].Netdev, nil
}

func netdevs(nsPath string) ([]string, error) { return rig.NetdevsIn(nsPath) }

func rdmaTool() string {
	for _, p := range []string{"/usr/sbin/rdma", "/sbin/rdma", "/usr/bin/rdma", "/bin/rdma"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "rdma"
}

// inNetns runs a command with the netns at nsPath ("" = host).
func inNetns(nsPath string, argv ...string) ([]byte, error) {
	run := func() ([]byte, error) {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		if err != nil {
			return out, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, out)
		}
		return out, nil
	}
	if nsPath == "" {
		return run()
	}
	var out []byte
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		out, err = run()
		return err
	})
	return out, err
}

// wantRDMA asserts where an RDMA device is, as `rdma dev` shows it.
func wantRDMA(t *testing.T, dev string, in, notIn []string) {
	t.Helper()
	for _, nsPath := range in {
		devs, err := rdmaDevs(nsPath)
		if err != nil {
			t.Fatal(err)
		}
		if !contains(devs, dev) {
			t.Fatalf("`rdma dev` in %s shows %v, want %s there\nplugin log:\n%s", where(nsPath), devs, dev, tailLog())
		}
	}
	for _, nsPath := range notIn {
		devs, err := rdmaDevs(nsPath)
		if err != nil {
			t.Fatal(err)
		}
		if contains(devs, dev) {
			t.Fatalf("`rdma dev` in %s shows %v, want no %s there\nplugin log:\n%s", where(nsPath), devs, dev, tailLog())
		}
	}
}

func wantNetdev(t *testing.T, dev, nsPath string) {
	t.Helper()
	links, err := netdevs(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	if !contains(links, dev) {
		t.Fatalf("netdev %s not in %s (has %v)", dev, where(nsPath), links)
	}
}

func wantNoRecords(t *testing.T) {
	t.Helper()
	if recs := records(); len(recs) > 0 {
		t.Fatalf("state records left in %s: %v", stateDir, recs)
	}
}

func where(nsPath string) string {
	if nsPath == "" {
		return "the host"
	}
	return "pod netns " + filepath.Base(nsPath)
}

func tailLog() string {
	data, _ := os.ReadFile(logFile)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}

// chain builds a conflist: host-device moving the NIC's netdev into the pod
// as CNI_IFNAME with a static address, then rdma-netns.
func chain(t *testing.T, name, device string, addr int, rdma map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	hd := map[string]any{
		"type":   "host-device",
		"device": device,
		"ipam": map[string]any{
			"type":      "static",
			"addresses": []map[string]any{{"address": rig.ChainIP(addr) + "/24"}},
		},
	}
	return conflist(t, name, hd, rdmaPlugin(rdma))
}

func rdmaPlugin(extra map[string]any) map[string]any {
	p := map[string]any{"type": "rdma-netns", "logFile": logFile, "logLevel": "debug"}
	for k, v := range extra {
		p[k] = v
	}
	return p
}

func conflist(t *testing.T, name string, plugins ...map[string]any) *libcni.NetworkConfigList {
	t.Helper()
	b, err := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": name, "plugins": plugins})
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.NetworkConfFromBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// attachedPod is where most tests start: layout's NIC added to a new pod
// (id) as net1 through chain name (address addr, rdma-netns options rdma).
func attachedPod(t *testing.T, layout, name string, addr int, rdma map[string]any, id string) (nic, *libcni.CNIConfig, *libcni.NetworkConfigList, *pod) {
	t.Helper()
	n := nicBy(t, layout)
	c := cni(t)
	l := chain(t, name, n.Netdev, addr, rdma)
	p := newPod(t, id)
	mustAdd(t, c, l, p.rt("net1"))
	return n, c, l, p
}

// mustDelHome runs DEL of p's net1 and checks that n's RDMA device and
// netdev are back on the host and that no record is left.
func mustDelHome(t *testing.T, c *libcni.CNIConfig, l *libcni.NetworkConfigList, p *pod, n nic) {
	t.Helper()
	mustDel(t, c, l, p.rt("net1"))
	wantRDMA(t, n.RDMA, []string{""}, []string{p.path()})
	wantNetdev(t, n.Netdev, "")
	wantNoRecords(t)
}

func cni(t *testing.T) *libcni.CNIConfig {
	return libcni.NewCNIConfigWithCacheDir([]string{cniBinDir}, t.TempDir(), nil)
}

func add(t *testing.T, c *libcni.CNIConfig, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) (types.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return c.AddNetworkList(ctx, l, rt)
}

func del(t *testing.T, c *libcni.CNIConfig, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return c.DelNetworkList(ctx, l, rt)
}

// mustAdd runs ADD and, like a runtime tearing a pod down, DEL at the end of
// the test (a no-op when the test already did it), so one failing test does
// not leave devices behind for the next.
func mustAdd(t *testing.T, c *libcni.CNIConfig, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) types.Result {
	t.Helper()
	t.Cleanup(func() { del(t, c, l, rt) })
	r, err := add(t, c, l, rt)
	if err != nil {
		t.Fatalf("ADD %s for %s: %v\nplugin log:\n%s", l.Name, rt.ContainerID, err, tailLog())
	}
	return r
}

func mustDel(t *testing.T, c *libcni.CNIConfig, l *libcni.NetworkConfigList, rt *libcni.RuntimeConf) {
	t.Helper()
	if err := del(t, c, l, rt); err != nil {
		t.Fatalf("DEL %s for %s: %v\nplugin log:\n%s", l.Name, rt.ContainerID, err, tailLog())
	}
}

func wantErrContains(t *testing.T, err error, parts ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("expected an error mentioning %q, got success", parts)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("error %q does not mention %q", err, p)
		}
	}
}

// execPlugin runs the rdma-netns binary for a verb without a container.
func execPlugin(verb string, conf []byte) error {
	cmd := exec.Command(filepath.Join(cniBinDir, "rdma-netns"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND="+verb, "CNI_PATH="+cniBinDir)
	cmd.Stdin = strings.NewReader(string(conf))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// writeParam sets a parameter of the test VM's patched rdma_rxe module.
func writeParam(name, value string) error {
	return os.WriteFile("/sys/module/rdma_rxe/parameters/"+name, []byte(value), 0o644)
}
