package doctor

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdma-netns/rdma-netns/pkg/rdmans"
)

func TestPodChecks(t *testing.T) {
	f := newNodeFixture(t)
	podA := filepath.Join(f.netnsDir, "pod-a")
	// pod-a: pause (ignored), a workload with container defaults and one
	// with what RDMA needs but without the device's uverbs node.
	f.fp.proc("41", "python", "pod-a", "8388608", "00000000a80425fb", 64<<20, "uverbs1", "rdma_cm")
	f.fp.proc("42", "torchrun", "pod-a", "unlimited", "00000000a80465fb", 16<<30, "rdma_cm")

	r := CheckPod(f.env, podA, 0)
	// Both workloads certainly fail: one cannot register memory, the
	// other cannot open its device.
	if r.ExitCode != 1 {
		t.Fatalf("exit %d, want 1: %+v", r.ExitCode, r.Findings)
	}
	if len(r.Pod.Devices) != 1 || r.Pod.Devices[0].Name != "mlx5_1" || r.Pod.Devices[0].Ports[0].GIDs != 1 {
		t.Fatalf("devices %+v", r.Pod.Devices)
	}
	if len(r.Pod.Processes) != 3 {
		t.Fatalf("processes %+v", r.Pod.Processes)
	}
	got := map[string]Severity{}
	for _, fd := range r.Findings {
		got[fd.Check+" "+fd.Subject] = fd.Severity
	}
	want := map[string]Severity{
		"device mlx5_1":                  OK,
		"process pid 40 (pause)":         OK,
		"memlock pid 41 (python)":        Fail,
		"shm pid 41 (python)":            Warn,
		"char-devices pid 41 (python)":   OK,
		"memlock pid 42 (torchrun)":      OK,
		"shm pid 42 (torchrun)":          OK,
		"char-devices pid 42 (torchrun)": Fail,
		// What the NRI plugin would have given, in one line each.
		"nri pid 41 (python)":   Warn,
		"nri pid 42 (torchrun)": Warn,
	}
	for k, sev := range want {
		if got[k] != sev {
			t.Errorf("%s: %q, want %s", k, got[k], sev)
		}
	}
	if len(got) != len(want) {
		t.Errorf("findings %v, want exactly %v", got, want)
	}

	// --pid: that process only.
	r = CheckPod(f.env, filepath.Join(f.fp.root, "41", "ns", "net"), 41)
	if len(r.Pod.Processes) != 1 || r.Pod.Processes[0].PID != 41 || len(r.Pod.Devices) != 1 || r.Pod.Devices[0].Name != "mlx5_1" {
		t.Fatalf("--pid: processes %+v, devices %+v", r.Pod.Processes, r.Pod.Devices)
	}
}

func TestPodWithoutDevice(t *testing.T) {
	f := newNodeFixture(t)
	empty := f.fp.netns("empty")
	r := CheckPod(f.env, empty, 0)
	if r.ExitCode != 1 {
		t.Fatalf("exit %d", r.ExitCode)
	}
	fs := findingsOf(r, "devices")
	if len(fs) != 1 || fs[0].Severity != Fail || !strings.Contains(fs[0].Reason, "no RDMA device") {
		t.Fatalf("%+v", fs)
	}
	if p := findingsOf(r, "processes"); len(p) != 1 || p[0].Severity != OK {
		t.Fatalf("no processes: %+v", p)
	}
}

func TestPodGIDsAndPortState(t *testing.T) {
	f := newNodeFixture(t)
	podB := filepath.Join(f.netnsDir, "pod-b")
	tr := f.pods[podB]
	// A second device in pod-b with an empty GID table and a down port.
	fn := "pci0000:00/0000:00:09.0"
	tr.PCI(fn)
	rdmaFixture(t, tr, f.env.DevRoot, fn, "mlx5_9", "net9", "1: DOWN", 0, 9)
	f.kernel.in[podB] = []string{"mlx5_2", "mlx5_9"}
	r := CheckPod(f.env, podB, 0)
	if r.ExitCode != 1 {
		t.Fatalf("empty GID table must fail: %+v", r.Findings)
	}
	for _, c := range []struct {
		check, subj string
		sev         Severity
	}{{"gids", "mlx5_9 port 1", Fail}, {"port-state", "mlx5_9 port 1", Warn}, {"device", "mlx5_2", OK}} {
		found := false
		for _, fd := range r.Findings {
			found = found || (fd.Check == c.check && fd.Subject == c.subj && fd.Severity == c.sev)
		}
		if !found {
			t.Errorf("no %s %s %s in %+v", c.sev, c.check, c.subj, r.Findings)
		}
	}
}

func TestPodNoRDMAStillChecksProcesses(t *testing.T) {
	f := newNodeFixture(t)
	f.kernel.modeErr = fmt.Errorf("%w: protocol not supported", rdmans.ErrNoRDMA)
	f.fp.proc("41", "python", "pod-a", "65536", "0", 64<<20)
	r := CheckPod(f.env, filepath.Join(f.netnsDir, "pod-a"), 0)
	if r.ExitCode != 1 || len(findingsOf(r, "rdma-subsystem")) != 1 {
		t.Fatalf("%+v", r.Findings)
	}
	if m := findingsOf(r, "memlock"); len(m) != 1 || m[0].Severity != Fail {
		t.Fatalf("memlock %+v", m)
	}
}

func TestPodBadNetns(t *testing.T) {
	f := newNodeFixture(t)
	r := CheckPod(f.env, "/nonexistent/netns", 0)
	if r.ExitCode != 1 || len(findingsOf(r, "netns")) != 1 {
		t.Fatalf("%+v", r.Findings)
	}
}

// What rdma-netns-nri gives a container (the pod's uverbs node and
// rdma_cm, unlimited memlock without IPC_LOCK, 1GiB /dev/shm) passes every
// check; each of the three missing is named, with the plugin as the fix
// and the by-hand fix of each.
func TestPodNRIThree(t *testing.T) {
	f := newNodeFixture(t)
	podA := filepath.Join(f.netnsDir, "pod-a")
	f.fp.proc("41", "nccl", "pod-a", "unlimited", "00000000a80425fb", 1<<30, "uverbs1", "rdma_cm")
	f.fp.proc("42", "bare", "pod-a", "65536", "00000000a80425fb", 64<<20)
	r := CheckPod(f.env, podA, 41)
	if r.ExitCode != 0 || r.Summary[Warn] != 0 || len(findingsOf(r, "nri")) != 0 {
		t.Fatalf("what the NRI plugin gives is not enough: %+v", r.Findings)
	}
	if strings.Join(r.Pod.VerbsNodes, " ") != "rdma_cm uverbs1" {
		t.Fatalf("verbs nodes %v", r.Pod.VerbsNodes)
	}

	r = CheckPod(f.env, podA, 42)
	if r.ExitCode != 1 {
		t.Fatalf("exit %d: %+v", r.ExitCode, r.Findings)
	}
	n := findingsOf(r, "nri")
	if len(n) != 1 || !strings.Contains(n[0].Reason, "lacks 3 of the 3") || !strings.Contains(n[0].Reason, "/dev/infiniband/uverbs1") ||
		!strings.Contains(n[0].Reason, "memlock") || !strings.Contains(n[0].Reason, "/dev/shm") || !strings.Contains(n[0].Remedy, "rdma-netns-nri") {
		t.Fatalf("nri finding %+v", n)
	}
	for _, check := range []string{"memlock", "shm", "char-devices"} {
		fs := findingsOf(r, check)
		if len(fs) != 1 || fs[0].Severity == OK || !strings.Contains(fs[0].Remedy, "rdma-netns-nri") || !strings.Contains(fs[0].Remedy, "by hand") {
			t.Errorf("%s: %+v, want a finding whose fix is the NRI plugin or the by-hand setting", check, fs)
		}
	}

	// The uverbs node is the one the kernel names from inside the pod,
	// not the one sysfs's infiniband_verbs pairs by device name.
	f.kernel.uverbs["mlx5_1"] = 7
	r = CheckPod(f.env, podA, 41)
	if cd := findingsOf(r, "char-devices"); len(cd) != 1 || cd[0].Severity != Fail || !strings.Contains(cd[0].Reason, "uverbs7") {
		t.Fatalf("char-devices %+v, want uverbs7 missing", cd)
	}
	// A kernel that cannot say: sysfs's pairing, uverbs and rdma_cm only.
	f.kernel.verbsErr = fmt.Errorf("operation not supported")
	r = CheckPod(f.env, podA, 41)
	if strings.Join(r.Pod.VerbsNodes, " ") != "rdma_cm uverbs1" || r.ExitCode != 0 {
		t.Fatalf("fallback: verbs nodes %v, findings %+v", r.Pod.VerbsNodes, r.Findings)
	}
}
