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

	r := Pod(f.env, podA, 0)
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
	r = Pod(f.env, filepath.Join(f.fp.root, "41", "ns", "net"), 41)
	if len(r.Pod.Processes) != 1 || r.Pod.Processes[0].PID != 41 || len(r.Pod.Devices) != 1 || r.Pod.Devices[0].Name != "mlx5_1" {
		t.Fatalf("--pid: processes %+v, devices %+v", r.Pod.Processes, r.Pod.Devices)
	}
}

func TestPodWithoutDevice(t *testing.T) {
	f := newNodeFixture(t)
	empty := f.fp.netns("empty")
	r := Pod(f.env, empty, 0)
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
	r := Pod(f.env, podB, 0)
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
	r := Pod(f.env, filepath.Join(f.netnsDir, "pod-a"), 0)
	if r.ExitCode != 1 || len(findingsOf(r, "rdma-subsystem")) != 1 {
		t.Fatalf("%+v", r.Findings)
	}
	if m := findingsOf(r, "memlock"); len(m) != 1 || m[0].Severity != Fail {
		t.Fatalf("memlock %+v", m)
	}
}

func TestPodBadNetns(t *testing.T) {
	f := newNodeFixture(t)
	r := Pod(f.env, "/nonexistent/netns", 0)
	if r.ExitCode != 1 || len(findingsOf(r, "netns")) != 1 {
		t.Fatalf("%+v", r.Findings)
	}
}
