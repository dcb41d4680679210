package doctor

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestExitCodes(t *testing.T) {
	tests := []struct {
		sevs []Severity
		exit int
	}{
		{nil, 0},
		{[]Severity{OK, OK}, 0},
		{[]Severity{OK, Warn, Warn}, 0},
		{[]Severity{Warn, Fail}, 1},
		{[]Severity{Fail}, 1},
	}
	for _, tt := range tests {
		r := &Report{}
		for _, s := range tt.sevs {
			r.Findings.add(s, "c", "s", "reason", "")
		}
		r.finish()
		if r.ExitCode != tt.exit {
			t.Errorf("%v: exit %d, want %d", tt.sevs, r.ExitCode, tt.exit)
		}
		if n := r.Summary[OK] + r.Summary[Warn] + r.Summary[Fail]; n != len(tt.sevs) {
			t.Errorf("%v: summary %v", tt.sevs, r.Summary)
		}
	}
}

func TestWriteText(t *testing.T) {
	r := &Report{Node: &NodeView{NetnsMode: "exclusive", StateDir: "/var/lib/cni/rdma-netns", Devices: []Device{
		{Name: "mlx5_0", Driver: "mlx5_core", PCIAddress: "0000:3b:00.0", Ports: []Port{{Port: 1, State: "ACTIVE", Netdevs: []string{"ens1f0"}, GIDs: 3}}, CharDevices: []string{"/dev/infiniband/uverbs0"}, Location: Location{Host: true}},
		{Name: "mlx5_10", Ports: []Port{{Port: 1, State: "DOWN"}, {Port: 2, State: "ACTIVE", Netdevs: []string{"net1"}, GIDs: 1}}, Location: Location{Netns: "/run/netns/cni-1", Owner: "net/cid/net1"}},
	}}}
	r.Findings.add(OK, "netns-mode", "node", "fine", "")
	r.Findings.add(Fail, "drift", "net/cid/net1", "it moved", "recreate the pod")
	r.Findings.add(Warn, "port-state", "mlx5_10 port 1", "down", "plug it in")
	r.finish()
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Logf("\n%s", out)
	for _, want := range []string{
		"netns mode          exclusive",
		"not configured",
		"2     ACTIVE  net1    1",
		"mlx5_0   mlx5_core  0000:3b:00.0  1     ACTIVE  ens1f0  3     uverbs0       host",
		"netns /run/netns/cni-1 [net/cid/net1]",
		"fix: recreate the pod",
		"1 ok, 1 warning(s), 1 failure(s); exit status 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	// Worst first.
	if f, w, o := strings.Index(out, "FAIL"), strings.Index(out, "WARN"), strings.Index(out, "OK  "); !(f < w && w < o) {
		t.Errorf("findings not ordered fail, warn, ok:\n%s", out)
	}
	// The second port of a device continues its row without repeating it.
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "2     ACTIVE  net1") && strings.Contains(line, "mlx5_10") {
			t.Errorf("second port repeats the device: %q", line)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Error("colour codes in plain output")
	}
}

// The JSON is for automation: check its shape, not just that it parses.
func TestWriteJSONShape(t *testing.T) {
	f := newNodeFixture(t)
	r := CheckNode(f.env)
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(b.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"node", "findings", "summary", "exitCode"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("no %q in %s", k, b.String())
		}
	}
	if _, ok := doc["pod"]; ok {
		t.Error("node report has a pod view")
	}
	node := doc["node"].(map[string]any)
	for _, k := range []string{"netnsMode", "persistent", "stateDir", "records", "devices", "namespaces"} {
		if _, ok := node[k]; !ok {
			t.Errorf("node lacks %q", k)
		}
	}
	dev := node["devices"].([]any)[1].(map[string]any)
	loc := dev["location"].(map[string]any)
	if dev["name"] != "mlx5_1" || loc["host"] != false || !strings.HasSuffix(loc["netns"].(string), "pod-a") || loc["owner"] != "rdma-net/cid-a/net1" {
		t.Errorf("device %v", dev)
	}
	port := dev["ports"].([]any)[0].(map[string]any)
	for _, k := range []string{"port", "state", "netdevs", "gids"} {
		if _, ok := port[k]; !ok {
			t.Errorf("port lacks %q: %v", k, port)
		}
	}
	fnd := doc["findings"].([]any)[0].(map[string]any)
	for _, k := range []string{"severity", "check", "reason"} {
		if _, ok := fnd[k]; !ok {
			t.Errorf("finding lacks %q: %v", k, fnd)
		}
	}
	sum := doc["summary"].(map[string]any)
	if _, ok := sum["warn"]; !ok {
		t.Errorf("summary %v", sum)
	}

	// Empty lists are [] rather than null, so consumers can iterate.
	f2 := newNodeFixture(t)
	f2.fp.proc("50", "app", "lonely", "unlimited", "0", 2<<30)
	pr := CheckPod(f2.env, f2.fp.netns("lonely"), 0)
	b.Reset()
	if err := pr.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"devices": []`) || !strings.Contains(b.String(), `"charDevices": []`) {
		t.Errorf("empty lists not []:\n%s", b.String())
	}
}

func TestRunFlags(t *testing.T) {
	f := newNodeFixture(t)
	tests := []struct {
		args []string
		exit int
		out  string // in stdout
		err  string // in stderr
	}{
		{[]string{"-h"}, 0, "", "Exit status: 1 if"},
		{[]string{"--bogus"}, 2, "", "flag provided but not defined"},
		{[]string{"extra"}, 2, "", `unexpected argument "extra"`},
		{[]string{"--netns", "/x", "--pid", "1"}, 2, "", "not both"},
		{[]string{"--pid", "-3"}, 2, "", "positive"},
		{[]string{"--state-dir", "relative"}, 2, "", "absolute"},
		{nil, 0, "RDMA devices", ""},
		{[]string{"--json"}, 0, `"exitCode": 0`, ""},
		{[]string{"--netns", f.fp.netns("nothing-here")}, 1, "no RDMA device is in this network namespace", ""},
	}
	for _, tt := range tests {
		var out, errb bytes.Buffer
		if got := runOn(tt.args, &out, &errb, f.env); got != tt.exit {
			t.Errorf("%v: exit %d, want %d\n%s%s", tt.args, got, tt.exit, out.String(), errb.String())
		}
		if !strings.Contains(out.String(), tt.out) || !strings.Contains(errb.String(), tt.err) {
			t.Errorf("%v: stdout %q / stderr %q, want %q / %q", tt.args, out.String(), errb.String(), tt.out, tt.err)
		}
	}
}

// On a node without RDMA (like the build host), the real doctor says so
// plainly and exits 1. Where the kernel has RDMA this says nothing.
func TestMainRealKernel(t *testing.T) {
	if _, err := (netlinkKernel{}).NetnsMode(); !isNoRDMA(err) {
		t.Skipf("this kernel answers RDMA netlink (%v); the no-RDMA path is covered with a fake kernel", err)
	}
	state := filepath.Join(t.TempDir(), "absent")
	var out, errb bytes.Buffer
	if code := Main([]string{"--state-dir", state}, &out, &errb); code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out.String(), errb.String())
	}
	t.Logf("\n%s", out.String())
	for _, want := range []string{"FAIL", "the kernel has no RDMA subsystem loaded", "fix: load the RDMA core", "exit status 1", "(not present)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Error("the doctor created the state directory")
	}
	out.Reset()
	if code := Main([]string{"--json", "--state-dir", state}, &out, &errb); code != 1 {
		t.Fatalf("--json exit %d", code)
	}
	var r Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.ExitCode != 1 || r.Summary[Fail] == 0 || r.Findings[0].Check != "rdma-subsystem" {
		t.Fatalf("--json: %v %+v", err, r)
	}
	// Pod checks on our own netns still run the process checks.
	out.Reset()
	if code := Main([]string{"--pid", strconv.Itoa(os.Getpid())}, &out, &errb); code != 1 || !strings.Contains(out.String(), "memlock") {
		t.Fatalf("--pid self: exit %d\n%s", code, out.String())
	}
}
