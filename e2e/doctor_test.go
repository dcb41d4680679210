//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/inventory"
)

// doctorHelperEnv makes the e2e binary a pod's workload: "low" runs with a
// 64KiB memlock limit, without CAP_IPC_LOCK and a 64MiB /dev/shm (the
// container defaults that break NCCL); "high" with unlimited memlock,
// CAP_IPC_LOCK and a 2GiB /dev/shm.
const doctorHelperEnv = "RDMA_NETNS_DOCTOR_WORKLOAD"

// TestDoctorWorkloadProcess is not a test: it is the process startWorkload
// runs in a pod. It sets itself up and becomes `sleep 1000`.
func TestDoctorWorkloadProcess(t *testing.T) {
	helperProcess(t, doctorHelperEnv, "doctor", becomeWorkload)
}

func becomeWorkload(kind string) error {
	// The process was started in a new mount namespace; keep its mounts
	// to itself, then give it its own /dev/shm as a container runtime does.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	shm, memlock := "64m", uint64(64<<10)
	if kind == "high" {
		shm, memlock = "2g", unix.RLIM_INFINITY
	}
	if err := unix.Mount("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+shm); err != nil {
		return fmt.Errorf("mount /dev/shm: %w", err)
	}
	if err := limitMemlock(memlock, kind == "low"); err != nil {
		return err
	}
	return syscall.Exec("/bin/sleep", []string{"sleep", "1000"}, os.Environ())
}

// limitMemlock gives the calling process, before it execs its workload, a
// container's memlock limit and, with dropIPCLock, no CAP_IPC_LOCK: out of
// the bounding set, the capability is gone after exec even for root, as in
// a container without IPC_LOCK. The bounding set belongs to the thread, so
// the thread is locked: the exec must come from the same one.
func limitMemlock(limit uint64, dropIPCLock bool) error {
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: limit}); err != nil {
		return fmt.Errorf("set memlock limit: %w", err)
	}
	if !dropIPCLock {
		return nil
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_IPC_LOCK, 0, 0, 0); err != nil {
		return fmt.Errorf("drop CAP_IPC_LOCK: %w", err)
	}
	return nil
}

// startWorkload starts a long-lived process in the pod's netns and its own
// mount namespace and returns its pid once it runs as `sleep`.
func startWorkload(t *testing.T, nsPath, kind string) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestDoctorWorkloadProcess$")
	cmd.Env = append(os.Environ(), doctorHelperEnv+"="+kind)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	// A child forked from a thread inside the netns starts in it.
	if err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error { return cmd.Start() }); err != nil {
		t.Fatalf("start workload: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	pid := cmd.Process.Pid
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			done <- err
			t.Fatalf("workload exited: %v: %s", err, stderr.String())
		default:
		}
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sleep" {
			return pid
		}
	}
	t.Fatalf("workload did not start: %s", stderr.String())
	return 0
}

// runDoctor runs `rdma-netns doctor ARGS --json` and, for the log, again
// without --json. It returns the report and the exit status.
func runDoctor(t *testing.T, args ...string) (*doctor.Report, int) {
	t.Helper()
	bin := filepath.Join(cniBinDir, "rdma-netns")
	text, textCode, err := doctorrun.Text(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rdma-netns doctor %s (exit %d):\n%s", strings.Join(args, " "), textCode, text)
	r, code, err := doctorrun.JSON(bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	if code != textCode {
		t.Fatalf("exit status %d with --json, %d without", code, textCode)
	}
	return r, code
}

func findings(r *doctor.Report, check, subjectPrefix string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range r.Findings {
		if f.Check == check && strings.HasPrefix(f.Subject, subjectPrefix) {
			out = append(out, f)
		}
	}
	return out
}

func wantFinding(t *testing.T, r *doctor.Report, sev doctor.Severity, check, subjectPrefix string, reasonParts ...string) doctor.Finding {
	t.Helper()
	for _, f := range findings(r, check, subjectPrefix) {
		if f.Severity != sev {
			continue
		}
		ok := true
		for _, p := range reasonParts {
			ok = ok && strings.Contains(f.Reason, p)
		}
		if ok {
			return f
		}
	}
	t.Fatalf("no %s finding %q about %q with %q; findings:\n%s", sev, check, subjectPrefix, reasonParts, dumpFindings(r))
	return doctor.Finding{}
}

func dumpFindings(r *doctor.Report) string {
	var b strings.Builder
	for _, f := range r.Findings {
		fmt.Fprintf(&b, "  %s %s %s: %s\n", f.Severity, f.Check, f.Subject, f.Reason)
	}
	return b.String()
}

func deviceIn(t *testing.T, devs []doctor.Device, name string) doctor.Device {
	t.Helper()
	for _, d := range devs {
		if d.Name == name {
			return d
		}
	}
	t.Fatalf("device %s not in the report (%d devices)", name, len(devs))
	return doctor.Device{}
}

// A pod whose workload has the container defaults (tiny memlock limit, no
// CAP_IPC_LOCK, 64MiB /dev/shm) fails on memlock (registration cannot
// work) and is warned about /dev/shm, with the fixes; exit status 1.
func TestDoctorPodLowLimits(t *testing.T) {
	requireMode(t, "exclusive")
	n, _, _, p := attachedPod(t, "pf", "rdma-doctor", 70, nil, "doctor-low")
	pid := startWorkload(t, p.path(), "low")
	subj := fmt.Sprintf("pid %d", pid)

	for _, args := range [][]string{{"--netns", p.path()}, {"--pid", strconv.Itoa(pid)}} {
		r, code := runDoctor(t, args...)
		if code != 1 {
			t.Fatalf("exit %d, want 1 for a pod that cannot register memory; findings:\n%s", code, dumpFindings(r))
		}
		f := wantFinding(t, r, doctor.Fail, "memlock", subj, "64KiB", "no CAP_IPC_LOCK", "ibv_reg_mr failed")
		if !strings.Contains(f.Remedy, "IPC_LOCK") || !strings.Contains(f.Remedy, "memlock=-1") {
			t.Errorf("memlock remedy %q lacks the fixes", f.Remedy)
		}
		f = wantFinding(t, r, doctor.Warn, "shm", subj, "64MiB", "posix_fallocate failed", "Bus error")
		if !strings.Contains(f.Remedy, "emptyDir") || !strings.Contains(f.Remedy, "NCCL_SHM_DISABLE=1") {
			t.Errorf("shm remedy %q lacks the fixes", f.Remedy)
		}
		d := deviceIn(t, r.Pod.Devices, n.RDMA)
		if len(d.Ports) == 0 || d.Ports[0].GIDs == 0 || !contains(d.Ports[0].Netdevs, "net1") {
			t.Errorf("pod view of %s: ports %+v, want port 1 with GIDs on net1", n.RDMA, d.Ports)
		}
		if len(r.Pod.Processes) != 1 || r.Pod.Processes[0].PID != pid || r.Pod.Processes[0].CapIPCLock {
			t.Errorf("processes %+v, want only the workload %d, without CAP_IPC_LOCK", r.Pod.Processes, pid)
		}
	}
}

// A pod whose workload has what RDMA needs gets no warning at all.
func TestDoctorPodHealthy(t *testing.T) {
	requireMode(t, "exclusive")
	n, _, _, p := attachedPod(t, "child", "rdma-doctor", 71, nil, "doctor-ok")
	pid := startWorkload(t, p.path(), "high")

	r, code := runDoctor(t, "--netns", p.path())
	if code != 0 || r.Summary[doctor.Warn] != 0 || r.Summary[doctor.Fail] != 0 {
		t.Fatalf("healthy pod: exit %d, findings:\n%s", code, dumpFindings(r))
	}
	subj := fmt.Sprintf("pid %d", pid)
	wantFinding(t, r, doctor.OK, "memlock", subj, "CAP_IPC_LOCK")
	wantFinding(t, r, doctor.OK, "shm", subj, "2GiB")
	wantFinding(t, r, doctor.OK, "device", n.RDMA)
	wantFinding(t, r, doctor.OK, "char-devices", subj, "uverbs")
}

// A device moved into a netns behind rdma-netns' back is a leak.
func TestDoctorLeak(t *testing.T) {
	requireMode(t, "exclusive")
	n := nicBy(t, "udev")
	p := newPod(t, "doctor-leak")
	target, err := netns.GetFromPath(p.path())
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	link, err := netlink.RdmaLinkByName(n.RDMA)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.RdmaLinkSetNsFd(link, uint32(target)); err != nil {
		t.Fatalf("move %s into %s: %v", n.RDMA, p.path(), err)
	}
	defer moveOutByNetlink(t, p.path(), n.RDMA)

	r, _ := runDoctor(t)
	f := wantFinding(t, r, doctor.Warn, "leak", n.RDMA, filepath.Base(p.path()), "no rdma-netns record owns it")
	if !strings.Contains(f.Remedy, "rdma dev set '"+n.RDMA+"' netns host") {
		t.Errorf("leak remedy %q does not say how to move it back", f.Remedy)
	}
	d := deviceIn(t, r.Node.Devices, n.RDMA)
	if d.Location.Host || !sameNetns(d.Location.Netns, p.path()) || d.Location.Owner != "" {
		t.Errorf("location of %s = %+v, want netns %s without owner", n.RDMA, d.Location, p.path())
	}
}

// After an ADD the node view shows every device, the pod's in the pod's
// netns owned by the attachment, and the record as consistent.
func TestDoctorNodeAfterAdd(t *testing.T) {
	requireMode(t, "exclusive")
	n, _, _, p := attachedPod(t, "child", "rdma-doctor", 72, nil, "doctor-node")

	r, code := runDoctor(t)
	if code != 0 {
		t.Fatalf("exit %d; findings:\n%s", code, dumpFindings(r))
	}
	if r.Node.NetnsMode != "exclusive" {
		t.Errorf("netns mode %q", r.Node.NetnsMode)
	}
	for _, x := range nics {
		d := deviceIn(t, r.Node.Devices, x.RDMA)
		if x.RDMA == n.RDMA {
			if !sameNetns(d.Location.Netns, p.path()) || d.Location.Owner != "rdma-doctor/doctor-node/net1" {
				t.Errorf("%s: location %+v, want %s owned by rdma-doctor/doctor-node/net1", x.RDMA, d.Location, p.path())
			}
			if len(d.Ports) == 0 || !contains(d.Ports[0].Netdevs, "net1") {
				t.Errorf("%s: ports %+v, want netdev net1", x.RDMA, d.Ports)
			}
		} else if !d.Location.Host {
			t.Errorf("%s: location %+v, want host", x.RDMA, d.Location)
		}
		if d.PCIAddress != x.PCI {
			t.Errorf("%s: PCI %q, want %s", x.RDMA, d.PCIAddress, x.PCI)
		}
		if len(d.CharDevices) == 0 {
			t.Errorf("%s: no character devices", x.RDMA)
		}
	}
	wantFinding(t, r, doctor.OK, "record", "rdma-doctor/doctor-node/net1", n.RDMA, "as recorded")
	if len(r.Node.Records) != 1 || r.Node.Records[0].Status != "ok" {
		t.Errorf("records %+v, want one ok", r.Node.Records)
	}
	if fs := findings(r, "leak", ""); len(fs) > 0 {
		t.Errorf("unexpected leaks: %+v", fs)
	}
}

// sameNetns reports whether two paths open the same network namespace
// (/run/netns and /var/run/netns are one directory in the VM).
func sameNetns(a, b string) bool {
	ia, err := inventory.Stat(a)
	if err != nil {
		return false
	}
	ib, err := inventory.Stat(b)
	return err == nil && ia == ib
}
