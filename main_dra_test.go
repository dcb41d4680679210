package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/plugins/pkg/testutils"

	"github.com/rdma-netns/rdma-netns/pkg/config"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

// The binary reads the DRA driver's records only at drarecord.DefaultDir
// and keeps its own at config.DefaultStateDir, the node's directories, and
// nothing a caller passes moves them. runOnNode gives it directories there
// without touching the test machine's: it runs this test binary in a
// private mount namespace, where TestMain binds them (nodeDirs) and
// executes the plugin. These variables are read by the test binary alone,
// never by the plugin.
const (
	onNodeExec    = "RDMA_NETNS_TEST_ON_NODE_EXEC"
	onNodeRecords = "RDMA_NETNS_TEST_ON_NODE_RECORDS"
	onNodeState   = "RDMA_NETNS_TEST_ON_NODE_STATE"
)

func TestMain(m *testing.M) {
	if bin := os.Getenv(onNodeExec); bin != "" {
		if err := nodeDirs(map[string]string{drarecord.DefaultDir: os.Getenv(onNodeRecords), config.DefaultStateDir: os.Getenv(onNodeState)}); err != nil {
			fmt.Fprintf(os.Stderr, "test helper: %v\n", err)
			os.Exit(125)
		}
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, onNodeExec+"=") && !strings.HasPrefix(kv, onNodeRecords+"=") && !strings.HasPrefix(kv, onNodeState+"=") {
				env = append(env, kv)
			}
		}
		err := syscall.Exec(bin, []string{bin}, env)
		fmt.Fprintf(os.Stderr, "test helper: exec %s: %v\n", bin, err)
		os.Exit(125)
	}
	os.Exit(m.Run())
}

// nodeDirs, in a mount namespace of its own, binds each directory given
// at its node path. Where a node path does not exist, a tmpfs over its
// nearest existing parent gives it a place (once: a second path below
// that parent is made in the same tmpfs), in this namespace only, which /
// made private keeps from the host's.
func nodeDirs(at map[string]string) error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private: %v", err)
	}
	var tmpfs []string
	for target, dir := range at {
		if dir == "" {
			continue
		}
		if _, err := os.Stat(target); err == nil {
			continue
		}
		base := filepath.Dir(target)
		for {
			if _, err := os.Stat(base); err == nil {
				break
			}
			base = filepath.Dir(base)
		}
		if !slices.ContainsFunc(tmpfs, func(m string) bool { return base == m || strings.HasPrefix(base, m+"/") }) {
			if err := syscall.Mount("tmpfs", base, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755,size=1m"); err != nil {
				return fmt.Errorf("tmpfs on %s: %v", base, err)
			}
			tmpfs = append(tmpfs, base)
		}
	}
	// Every node path again: a tmpfs mounted for one may hide another.
	for target, dir := range at {
		if dir == "" {
			continue
		}
		if err := os.MkdirAll(target, 0o700); err != nil {
			return err
		}
		if err := syscall.Mount(dir, target, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding %s at %s: %v", dir, target, err)
		}
	}
	return nil
}

// onNode is what runOnNode gives the binary at the node's paths: the DRA
// driver's records and the plugin's state directory (either may be "").
type onNode struct{ records, state string }

// runOnNode runs bin as run does, on a node whose DRA records and plugin
// records are n's.
func runOnNode(t *testing.T, bin string, n onNode, env []string, stdin string) (stdout, stderr string, code int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a mount namespace that gives the binary the node's directories")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), onNodeExec + "=" + bin, onNodeRecords + "=" + n.records, onNodeState + "=" + n.state}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	return runCmd(t, cmd, stdin)
}

// hostUntouched fails the test if a mount at the node's record directory
// or one of its parents, or the directory itself, appeared on the test
// machine while the test ran: the records runOnNode gives the plugin stay
// in its private namespace. (Other mounts are not compared: other tests
// on the machine may mount and unmount beside this one.)
func hostUntouched(t *testing.T) {
	t.Helper()
	nodePaths := []string{drarecord.DefaultDir, config.DefaultStateDir}
	under := func(mp string) bool {
		return slices.ContainsFunc(nodePaths, func(p string) bool {
			return mp == p || strings.HasPrefix(p, mp+"/") || strings.HasPrefix(mp, p+"/")
		})
	}
	mounts := func() string {
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		var at []string
		for _, l := range strings.Split(string(b), "\n") {
			// Field 5 is the mount point.
			if f := strings.Fields(l); len(f) > 4 && f[4] != "/" && under(f[4]) {
				at = append(at, l)
			}
		}
		return strings.Join(at, "\n")
	}
	exists := func() string {
		s := ""
		for _, p := range append([]string{"/var/lib/cni"}, nodePaths...) {
			_, err := os.Stat(p)
			s += fmt.Sprintf("%s:%v ", p, err == nil)
		}
		return s
	}
	before, there := mounts(), exists()
	t.Cleanup(func() {
		if after := mounts(); after != before {
			t.Errorf("the test machine's mounts at %v or their parents changed:\nbefore\n%s\nafter\n%s", nodePaths, before, after)
		}
		if now := exists(); now != there {
			t.Errorf("the node directories on the test machine changed: before %s, after %s", there, now)
		}
	})
}

// fakePlugin writes an executable CNI plugin into dir that appends its
// name, verb, CNI_IFNAME and stdin to log, and answers ADD with result.
func fakePlugin(t *testing.T, dir, name, log, result string) {
	t.Helper()
	script := "#!/bin/sh\nprintf '" + name + " %s %s ' \"$CNI_COMMAND\" \"$CNI_IFNAME\" >> " + log + "\ncat >> " + log + "\necho >> " + log + "\n" +
		"if [ \"$CNI_COMMAND\" = ADD ]; then printf '%s' '" + result + "'; fi\n"
	if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
}

// draBinaryEnv is a node for the built binary in dra mode: a pod netns,
// fake host-device and IPAM plugins that log their calls, and the node's
// DRA records holding one claim of pod uid, its NIC at 0000:fe:1f.7 (no
// node has it: ADD fails after host-device).
type draBinaryEnv struct {
	bin, tmp, cniPath, records string
	netns                      string
	calls                      func() []string
}

const draBinaryPod = "7f3c9a62-0b1d-4a8e-9c55-2f6d1e0a4b01"

func newDRABinaryEnv(t *testing.T) *draBinaryEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace and a mount namespace")
	}
	hostUntouched(t)
	bin := buildBinary(t)
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		netns.Close()
		testutils.UnmountNS(netns)
	})
	tmp := t.TempDir()
	e := &draBinaryEnv{bin: bin, tmp: tmp, cniPath: filepath.Join(tmp, "bin"), records: filepath.Join(tmp, "node-records"), netns: netns.Path()}
	log := filepath.Join(tmp, "calls.log")
	for _, d := range []string{e.cniPath, e.node().state} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	fakePlugin(t, e.cniPath, "host-device", log, `{"cniVersion":"1.1.0","interfaces":[{"name":"net1","sandbox":"`+netns.Path()+`"}]}`)
	fakePlugin(t, e.cniPath, "fake-ipam", log, "")
	if err := drarecord.Dir(e.records).Write(&drarecord.Claim{Version: 1, ClaimUID: "c1", PodUID: draBinaryPod,
		Devices: []drarecord.Device{{Request: "nics", PCIAddress: "0000:fe:1f.7"}}}); err != nil {
		t.Fatal(err)
	}
	e.calls = func() []string {
		b, _ := os.ReadFile(log)
		os.Remove(log)
		if len(b) == 0 {
			return nil
		}
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	return e
}

// conf is the network, its "dra" object being dra.
func (e *draBinaryEnv) conf(dra string) string {
	return `{"cniVersion":"1.1.0","name":"rdma-dra","type":"rdma-netns","dra":` + dra + `,"ipam":{"type":"fake-ipam"}}`
}

// node is the node's directories the binary runs with.
func (e *draBinaryEnv) node() onNode {
	return onNode{records: e.records, state: filepath.Join(e.tmp, "state")}
}

func (e *draBinaryEnv) env(verb, ns string) []string {
	return []string{"CNI_COMMAND=" + verb, "CNI_CONTAINERID=c0ffee", "CNI_NETNS=" + ns, "CNI_IFNAME=net1",
		"CNI_PATH=" + e.cniPath, "CNI_ARGS=K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_UID=" + draBinaryPod}
}

// In dra mode the binary runs the host-device it finds in CNI_PATH with
// the claimed NIC's PCI address (from the node's records) and the
// network's ipam, takes its result, and runs host-device's DEL when its
// own ADD then fails (this node has no NIC at that address); DEL runs
// host-device's DEL by interface name, and with the netns gone only the
// IPAM plugin's. A NAD naming the node's record directory works as one
// without.
func TestBinaryDRADelegates(t *testing.T) {
	e := newDRABinaryEnv(t)
	for _, dra := range []string{`{}`, `{"recordDir":"` + drarecord.DefaultDir + `"}`} {
		conf := e.conf(dra)
		out, errOut, code := runOnNode(t, e.bin, e.node(), e.env("ADD", e.netns), conf)
		if code == 0 {
			t.Fatalf("ADD of a NIC this node does not have succeeded: %s", out)
		}
		got := e.calls()
		if len(got) != 2 ||
			got[0] != `host-device ADD net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device","pciBusID":"0000:fe:1f.7","ipam":{"type":"fake-ipam"}}` ||
			got[1] != `host-device DEL net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device","device":"net1","ipam":{"type":"fake-ipam"}}` {
			t.Fatalf("dra %s: ADD ran %q (stdout %s, stderr %s); want host-device's ADD, then its DEL", dra, got, out, errOut)
		}

		if out, errOut, code := runOnNode(t, e.bin, e.node(), e.env("DEL", e.netns), conf); code != 0 {
			t.Fatalf("DEL: exit %d, %s %s", code, out, errOut)
		}
		if got := e.calls(); len(got) != 1 || !strings.HasPrefix(got[0], `host-device DEL net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device","device":"net1"`) {
			t.Fatalf("DEL ran %q, want host-device's DEL", got)
		}

		if out, errOut, code := runOnNode(t, e.bin, e.node(), e.env("DEL", filepath.Join(e.tmp, "gone")), conf); code != 0 {
			t.Fatalf("DEL with the netns gone: exit %d, %s %s", code, out, errOut)
		}
		if got := e.calls(); len(got) != 1 || !strings.HasPrefix(got[0], `fake-ipam DEL net1 {"cniVersion":"1.1.0","name":"rdma-dra","type":"host-device"`) {
			t.Fatalf("DEL with the netns gone ran %q, want the IPAM plugin's DEL (its stdin is host-device's config)", got)
		}
	}
}

// A NAD cannot choose where the binary reads the DRA driver's records:
// one whose dra.recordDir names a directory of its own (a pod's emptyDir
// on the node), holding a record for the pod that names another NIC,
// fails ADD and host-device never runs. DEL of that network still runs.
func TestBinaryDRANADRecordDirRefused(t *testing.T) {
	e := newDRABinaryEnv(t)
	forged := filepath.Join(e.tmp, "emptydir")
	if err := drarecord.Dir(forged).Write(&drarecord.Claim{Version: 1, ClaimUID: "forged", PodUID: draBinaryPod,
		Devices: []drarecord.Device{{Request: "nics", PCIAddress: "0000:3b:00.0"}}}); err != nil {
		t.Fatal(err)
	}
	conf := e.conf(`{"recordDir":"` + forged + `"}`)
	out, errOut, code := runOnNode(t, e.bin, e.node(), e.env("ADD", e.netns), conf)
	if got := e.calls(); got != nil {
		t.Fatalf("ADD ran %q (exit %d, stdout %s, stderr %s); want no plugin run", got, code, out, errOut)
	}
	if code == 0 || !strings.Contains(out, "dra.recordDir") || !strings.Contains(out, drarecord.DefaultDir) || !strings.Contains(out, "nothing was changed") {
		t.Fatalf("ADD: exit %d, stdout %s, stderr %s; want a refusal naming dra.recordDir and %s", code, out, errOut, drarecord.DefaultDir)
	}
	if out, errOut, code := runOnNode(t, e.bin, e.node(), e.env("DEL", e.netns), conf); code != 0 {
		t.Fatalf("DEL: exit %d, %s %s", code, out, errOut)
	}
}
