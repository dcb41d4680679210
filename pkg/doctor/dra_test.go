package doctor

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// draClaim records a claim of one device for pod ns/pod, as the driver
// would at Prepare.
func draClaim(t *testing.T, dir, uid, ns, claim, pod, pci, rdma string) {
	t.Helper()
	c := &drarecord.Claim{Version: drarecord.Version, ClaimUID: uid, ClaimNamespace: ns, ClaimName: claim,
		PodUID: "pod-" + uid, PodNamespace: ns, PodName: pod,
		Devices: []drarecord.Device{{Request: "nics", Pool: "node-1", Device: "pci-x", PCIAddress: pci, Netdev: "eth9", RdmaDevice: rdma}}}
	if err := drarecord.Dir(dir).Write(c); err != nil {
		t.Fatal(err)
	}
}

// draFixture: the node fixture, pod-a's record naming pod team/trainer-a,
// and a DRA record directory.
func draFixture(t *testing.T) (*nodeFixture, string) {
	t.Helper()
	f := newNodeFixture(t)
	podA := filepath.Join(f.netnsDir, "pod-a")
	if err := f.store.Put(&state.Record{Key: state.Key{Network: "rdma-net", ContainerID: "cid-a", IfName: "net1"}, Netns: podA, Device: "mlx5_1",
		State: state.StateAttached, K8sNamespace: "team", K8sPod: "trainer-a", Created: time.Now()}); err != nil {
		t.Fatal(err)
	}
	f.env.DRADir = filepath.Join(t.TempDir(), "dra")
	return f, f.env.DRADir
}

func draByClaim(r *Report) map[string]DRADevice {
	out := map[string]DRADevice{}
	if r.Node.DRA == nil {
		return out
	}
	for _, d := range r.Node.DRA.Devices {
		out[d.ClaimName] = d
	}
	return out
}

func draFindingsOf(r *Report) []Finding {
	var out []Finding
	for _, f := range r.Findings {
		if strings.HasPrefix(f.Check, "dra") {
			out = append(out, f)
		}
	}
	return out
}

func draFinding(r *Report, claim string) *Finding {
	for _, f := range r.Findings {
		if f.Check == "dra-device" && f.Subject == "claim team/"+claim {
			return &f
		}
	}
	return nil
}

// Each claimed NIC is judged by where the kernel shows it: in its pod,
// still on the host, in another pod, in a netns no record names a pod
// for, or nowhere.
func TestNodeDRADevices(t *testing.T) {
	f, dir := draFixture(t)
	// A node without the record directory does not use DRA: nothing
	// about it in the report.
	if r := CheckNode(f.env); r.Node.DRA != nil || len(draFindingsOf(r)) != 0 {
		t.Errorf("without records: view %+v, findings %+v", r.Node.DRA, draFindingsOf(r))
	}
	draClaim(t, dir, "u-host", "team", "c-host", "trainer-h", "0000:00:03.0", "mlx5_0")
	draClaim(t, dir, "u-a", "team", "c-a", "trainer-a", "0000:00:04.0", "mlx5_1")
	draClaim(t, dir, "u-other", "team", "c-other", "trainer-o", "0000:00:04.0", "mlx5_1")
	draClaim(t, dir, "u-b", "team", "c-b", "trainer-b", "0000:00:05.0", "mlx5_2")
	draClaim(t, dir, "u-gone", "team", "c-gone", "trainer-g", "0000:00:09.0", "mlx5_9")
	r := CheckNode(f.env)

	want := map[string]struct {
		status, device string
		sev            Severity
		reason         string
	}{
		"c-host":  {"on-host", "mlx5_0", Warn, "claimed by pod team/trainer-h but on the host: its sandbox has not attached it yet"},
		"c-a":     {"attached", "mlx5_1", OK, "of pod team/trainer-a, which claims it"},
		"c-other": {"other-pod", "mlx5_1", Fail, "claimed by pod team/trainer-o but pod team/trainer-a holds it"},
		"c-b":     {"unowned", "mlx5_2", Warn, "no rdma-netns record names a pod for"},
		"c-gone":  {"missing", "", Warn, "no RDMA device on the node has that PCI address"},
	}
	got := draByClaim(r)
	if len(got) != len(want) {
		t.Fatalf("DRA view %+v", r.Node.DRA)
	}
	for claim, w := range want {
		d := got[claim]
		if d.Status != w.status || d.Device != w.device || d.PodName == "" || d.Request != "nics" {
			t.Errorf("%s: %+v, want status %s device %s", claim, d, w.status, w.device)
		}
		fd := draFinding(r, claim)
		if fd == nil || fd.Severity != w.sev || !strings.Contains(fd.Reason, w.reason) {
			t.Errorf("%s: finding %+v, want %s %q", claim, fd, w.sev, w.reason)
		}
	}
	if h := draFinding(r, "c-host"); h == nil || !strings.Contains(h.Remedy, "kubectl -n 'team' describe pod 'trainer-h'") {
		t.Errorf("on-host remedy %+v", h)
	}
	if r.ExitCode != 1 {
		t.Errorf("a NIC another pod holds must fail: exit %d", r.ExitCode)
	}

	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	line := func(re string) bool { return regexp.MustCompile(`(?m)^` + re + `$`).MatchString(text.String()) }
	if !line(`NICs by ResourceClaim \(`+regexp.QuoteMeta(dir)+`\)`) ||
		!line(`  team/c-host +team/trainer-h +nics +0000:00:03\.0 +mlx5_0 +mlx5_0 in host`) ||
		!line(`  team/c-a +team/trainer-a +nics +0000:00:04\.0 +mlx5_1 +mlx5_1 in netns \S+ \[rdma-net/cid-a/net1\]`) ||
		!line(`  team/c-gone +team/trainer-g +nics +0000:00:09\.0 +mlx5_9 +missing`) {
		t.Errorf("text report:\n%s", text.String())
	}
	var js bytes.Buffer
	if err := r.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Node struct {
			DRA struct {
				Dir     string
				Devices []struct {
					ClaimName, PodNamespace, PodName, Request, PCIAddress, RdmaDevice, Status, HeldBy string
				}
			} `json:"dra"`
		} `json:"node"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Node.DRA.Dir != dir || len(back.Node.DRA.Devices) != 5 {
		t.Fatalf("JSON dra %+v", back.Node.DRA)
	}
	for _, d := range back.Node.DRA.Devices {
		if d.ClaimName == "c-other" && (d.Status != "other-pod" || d.HeldBy != "team/trainer-a" || d.PCIAddress != "0000:00:04.0" || d.RdmaDevice != "mlx5_1") {
			t.Errorf("JSON c-other %+v", d)
		}
	}
}

// A damaged record is one warning naming its file; the whole records are
// still listed.
func TestNodeDRADamaged(t *testing.T) {
	f, dir := draFixture(t)
	draClaim(t, dir, "u-a", "team", "c-a", "trainer-a", "0000:00:04.0", "mlx5_1")
	bad := filepath.Join(dir, "u-bad.json")
	write(t, bad, `{"version": 1, "claimUID": `)
	r := CheckNode(f.env)
	var warns []Finding
	for _, fd := range r.Findings {
		if fd.Check == "dra-records" {
			warns = append(warns, fd)
		}
	}
	if len(warns) != 1 || warns[0].Severity != Warn || !strings.Contains(warns[0].Reason, bad) {
		t.Errorf("damaged record findings %+v", warns)
	}
	if got := draByClaim(r); len(got) != 1 || got["c-a"].Status != "attached" {
		t.Errorf("DRA view %+v", r.Node.DRA)
	}
}

// In shared mode the driver publishes nothing: records there are said to
// be of no use, and no device is judged.
func TestNodeDRASharedMode(t *testing.T) {
	f, dir := draFixture(t)
	f.kernel.mode = rdmans.ModeShared
	draClaim(t, dir, "u-host", "team", "c-host", "trainer-h", "0000:00:03.0", "mlx5_0")
	r := CheckNode(f.env)
	var shared []Finding
	for _, fd := range r.Findings {
		if fd.Check == "dra-shared-mode" {
			shared = append(shared, fd)
		}
		if fd.Check == "dra-device" {
			t.Errorf("device judged in shared mode: %+v", fd)
		}
	}
	if len(shared) != 1 || shared[0].Severity != Warn || !strings.Contains(shared[0].Reason, "publishes no devices") {
		t.Errorf("shared-mode findings %+v", shared)
	}
	if got := draByClaim(r); got["c-host"].Status != "shared" {
		t.Errorf("DRA view %+v", r.Node.DRA)
	}
}

// Names in records come from the API server, as untrusted as the pod:
// the text report escapes them, and prints no command naming them.
func TestNodeDRAEscapes(t *testing.T) {
	f, dir := draFixture(t)
	evil := "x\x1b]52;c;AAAA\x07\ny"
	draClaim(t, dir, "u-host", "team", "c-host", evil, "0000:00:03.0", "mlx5_0")
	r := CheckNode(f.env)
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	if strings.ContainsAny(out, "\x1b\x07") || strings.Contains(out, "\ny") || !strings.Contains(out, `team/x\x1b]52;c;AAAA\x07\x0ay`) {
		t.Errorf("text report:\n%q", out)
	}
	if h := draFinding(r, "c-host"); h == nil || !strings.Contains(h.Remedy, notPasteable) {
		t.Errorf("remedy %+v", h)
	}
}

// The flag names the directory; a relative one is a usage error.
func TestDoctorDRADirFlag(t *testing.T) {
	var out, errb bytes.Buffer
	if code := runOn([]string{"--dra-dir", "rel"}, &out, &errb, nil); code != 2 || !strings.Contains(errb.String(), "--dra-dir") {
		t.Errorf("exit %d, stderr %q", code, errb.String())
	}
}
