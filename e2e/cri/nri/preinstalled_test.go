//go:build e2e

package nri_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/cri/nririg"
)

// wantBy checks which instance of the plugin adjusted the container, by
// the annotation it put in the container's OCI spec.
func wantBy(t *testing.T, c *cririg.Container, who string) {
	t.Helper()
	by, err := nririg.AdjustedBy(c)
	if err != nil {
		t.Fatal(err)
	}
	if by != who {
		t.Fatalf("container of %s adjusted by %q, want %q\nDaemonSet instance's log:\n%s\nlaunched copy's log:\n%s",
			c.Pod.Spec.Name, by, who, nririg.PluginLog.Since(0), nririg.LaunchedLog.Since(0))
	}
}

// restartContainerd kills containerd and starts it again, as a runtime
// restart (or, with the pods gone, a reboot) does, and logs how long it
// took to answer CRI and how long it spent on the pre-installed plugin.
func restartContainerd(t *testing.T, why string) {
	t.Helper()
	var err error
	if ctd, err = ctd.Restart(); err != nil {
		t.Fatal(err)
	}
	d, lines, err := nririg.PluginStartup(ctd)
	if err != nil {
		t.Logf("%s: containerd answered CRI %s after its start; %v", why, ctd.StartTime.Round(time.Millisecond), err)
		return
	}
	t.Logf("%s: containerd answered CRI %s after its start, of which %s starting the pre-installed NRI plugins:\n%s",
		why, ctd.StartTime.Round(time.Millisecond), d.Round(time.Millisecond), strings.Join(lines, "\n"))
}

// The install path of the DaemonSet on a node whose runtime already runs:
// before the runtime restarts, the DaemonSet's instance serves; once it
// has restarted, the copy it launched serves and the DaemonSet's instance
// stands by; should the launched copy die, the DaemonSet's instance takes
// over. Every container created along the way gets its devices, memlock
// and /dev/shm from exactly one instance (two would make containerd fail
// the container: both set the same devices and rlimit), which its
// annotation names.
func TestPreinstalledInstallPath(t *testing.T) {
	exclusiveOnly(t)
	nririg.Uninstall()
	t.Cleanup(nririg.Uninstall)
	pod := runPod(t, cririg.PodSpec{Name: "nri-install", Handler: "rdma-eth1"})
	first := runContainer(t, pod, unprivileged("before-install"))
	wantAdjusted(t, first, 1<<20)
	wantBy(t, first, nririg.ByDaemonSet)

	// The init container installs while containerd runs: nothing changes
	// until containerd's next start.
	out, err := nririg.Install()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("rdma-netns install: %s", out)
	if pids := nririg.LaunchedPids(); len(pids) != 0 {
		t.Fatalf("containerd launched the plugin without a restart: %v", pids)
	}
	c := runContainer(t, pod, unprivileged("installed"))
	wantAdjusted(t, c, 1<<20)
	wantBy(t, c, nririg.ByDaemonSet)

	// containerd restarts: it launches the pre-installed copy before it
	// serves; the DaemonSet's instance, reconnecting, finds the lock
	// taken and stands by.
	before := nririg.PluginLog.Lines()
	restartContainerd(t, "restart with the plugin pre-installed")
	if err := nririg.PluginLog.Wait(before, "standing by", 30*time.Second); err != nil {
		t.Fatalf("%v:\n%s", err, nririg.PluginLog.Since(before))
	}
	pids := nririg.LaunchedPids()
	if len(pids) != 1 {
		t.Fatalf("%d launched copies running, want 1", len(pids))
	}
	c = runContainer(t, pod, unprivileged("after-restart"))
	wantAdjusted(t, c, 1<<20)
	wantBy(t, c, nririg.ByLaunched)
	for _, old := range []*cririg.Container{first} {
		wantAdjusted(t, old, 1<<20)
	}
	if l := nririg.LaunchedLog.Since(0); !strings.Contains(l, "nri-test/nri-install/before-install (") || !strings.Contains(l, "adjusted at its creation by 50-rdma-netns") {
		t.Fatalf("the launched copy did not report the running containers as adjusted:\n%s", l)
	}
	t.Logf("DaemonSet instance's log across the restart:\n%s", nririg.PluginLog.Since(before))

	// The launched copy dies (containerd does not start it again until
	// its own next start): the DaemonSet's instance takes the lock and
	// serves.
	before = nririg.PluginLog.Lines()
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := nririg.PluginLog.Wait(before, "at connection", 30*time.Second); err != nil {
		t.Fatalf("%v:\n%s", err, nririg.PluginLog.Since(before))
	}
	t.Logf("the launched copy killed: the DaemonSet's instance served %s later", time.Since(start).Round(time.Millisecond))
	c = runContainer(t, pod, unprivileged("after-launched-died"))
	wantAdjusted(t, c, 1<<20)
	wantBy(t, c, nririg.ByDaemonSet)

	// A pre-installed copy that cannot serve: the lock is held (by the
	// test, standing in for an instance that hangs) when containerd
	// starts. containerd waits for the copy, which gives up after its
	// wait for the lock, logs the failure and serves CRI without it.
	plugin.Stop()
	lock := holdLock(t)
	restartContainerd(t, "restart with the pre-installed copy unable to serve")
	if _, lines, _ := nririg.PluginStartup(ctd); !strings.Contains(strings.Join(lines, "\n"), "failed to start pre-installed NRI plugin") {
		t.Fatalf("containerd did not report the copy's failure:\n%s", strings.Join(lines, "\n"))
	}
	if pids := nririg.LaunchedPids(); len(pids) != 0 {
		t.Fatalf("the copy that could not take the lock still runs: %v", pids)
	}
	if plugin, err = nririg.StartPluginUntil("standing by"); err != nil {
		t.Fatal(err)
	}
	before = nririg.PluginLog.Lines()
	lock.Close()
	if err := nririg.PluginLog.Wait(before, "at connection", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	wantBy(t, runContainer(t, pod, unprivileged("lock-freed")), nririg.ByDaemonSet)

	// Leave containerd without the launched copy for the next test.
	before = nririg.PluginLog.Lines()
	nririg.Uninstall()
	restartContainerd(t, "restart without the plugin pre-installed")
	if err := nririg.PluginLog.Wait(before, "at connection", 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// As after a reboot: the plugin pre-installed, no pod left, containerd
// starts while the DaemonSet's instance is not running yet, and every pod
// is re-created at once. Each container's first start has its devices,
// memlock and /dev/shm, from the copy containerd launched. The DaemonSet's
// instance, started later, stands by. A container created while neither
// serves starts without, and `rdma-netns doctor` lists it.
func TestPreinstalledAfterReboot(t *testing.T) {
	exclusiveOnly(t)
	t.Cleanup(nririg.Uninstall)
	if _, err := nririg.Install(); err != nil {
		t.Fatal(err)
	}
	plugin.Stop()
	if err := ctd.Cleanup(context.Background()); err != nil {
		t.Fatal(err)
	}
	restartContainerd(t, "reboot with the plugin pre-installed")
	if pids := nririg.LaunchedPids(); len(pids) != 1 {
		t.Fatalf("%d launched copies after containerd's start, want 1", len(pids))
	}

	var specs []cririg.PodSpec
	for i, h := range []string{"", "rdma-eth1", "rdma-eth2"} { // the VM's three RDMA networks
		specs = append(specs, cririg.PodSpec{Name: fmt.Sprintf("nri-reboot-%d", i), Handler: h})
	}
	ctrs, took := runWorkers(t, specs)
	for i, c := range ctrs {
		wantAdjusted(t, c, 1<<20)
		wantBy(t, c, nririg.ByLaunched)
		t.Logf("%s: container created and started in %s, adjusted by the launched copy", c.Pod.Spec.Name, took[i].Round(time.Millisecond))
	}

	// The DaemonSet's instance starts: it stands by.
	var err error
	if plugin, err = nririg.StartPluginUntil("standing by"); err != nil {
		t.Fatal(err)
	}
	c := runContainer(t, ctrs[0].Pod, unprivileged("sidecar"))
	wantAdjusted(t, c, 1<<20)
	wantBy(t, c, nririg.ByLaunched)

	// Neither serves: the launched copy is gone and the lock held (by the
	// test, standing in for a copy that hangs). The container starts
	// without, and the doctor lists it; the adjusted ones are not listed.
	// (The DaemonSet's instance is stopped meanwhile, or it would take
	// the lock first.)
	plugin.Stop()
	pids := nririg.LaunchedPids()
	syscall.Kill(pids[0], syscall.SIGKILL)
	lock := holdLock(t)
	defer lock.Close()
	if plugin, err = nririg.StartPluginUntil("standing by"); err != nil {
		t.Fatal(err)
	}
	bare := runContainer(t, ctrs[1].Pod, unprivileged("while-none-serves"))
	if by, _ := nririg.AdjustedBy(bare); by != "" {
		t.Fatalf("adjusted by %q while no instance could serve", by)
	}
	findings, code := runDoctor(t)
	var missed []string
	for _, f := range findings {
		if f.Check == "nri-missed" {
			missed = append(missed, f.Subject)
			t.Logf("doctor: %s %s %s: %s", f.Severity, f.Check, f.Subject, f.Reason)
		}
	}
	if len(missed) != 1 || missed[0] != "nri-test/"+ctrs[1].Pod.Spec.Name+"/while-none-serves" {
		t.Fatalf("doctor lists %v as created without the plugin (exit %d), want only the bare container", missed, code)
	}
	t.Logf("doctor: %v created without the plugin", missed)

	// The lock freed, the DaemonSet's instance serves.
	before := nririg.PluginLog.Lines()
	lock.Close()
	if err := nririg.PluginLog.Wait(before, "at connection", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if l := nririg.PluginLog.Since(before); !strings.Contains(l, "while-none-serves") || !strings.Contains(l, "runs without /dev/infiniband/") {
		t.Fatalf("the DaemonSet's instance did not report the bare container at connection:\n%s", l)
	}
	wantBy(t, runContainer(t, ctrs[1].Pod, unprivileged("after")), nririg.ByDaemonSet)
}

// holdLock takes the plugin's lock, as soon as its holder lets go; closing
// the file releases it.
func holdLock(t *testing.T) *os.File {
	t.Helper()
	lock, err := os.OpenFile("/var/run/nri/rdma-netns-nri.lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := cririg.Wait(10*time.Second, "the plugin lets go of its lock", func() (bool, error) {
		return syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil, nil
	}); err != nil {
		lock.Close()
		t.Fatal(err)
	}
	return lock
}

// In shared mode the plugin gives nothing to anyone (TestSharedMode-
// NothingForAnyone), and the doctor fails the node that runs it.
func TestSharedModeDoctorFailsThePlugin(t *testing.T) {
	if cririg.NetnsMode() != "shared" {
		t.Skip("the shared-mode VM's test")
	}
	findings, code := runDoctor(t)
	for _, f := range findings {
		if f.Check == "nri-plugin" && f.Severity == "fail" && strings.Contains(f.Reason, "shared mode") {
			t.Logf("doctor: %s", f.Reason)
			if code != 1 {
				t.Fatalf("doctor exit %d with a FAIL", code)
			}
			return
		}
	}
	t.Fatalf("doctor does not fail the node that runs the plugin in shared mode: %+v", findings)
}

// A pod whose rdma-netns.io/shm-size is not a Kubernetes quantity: its
// container gets the node's default /dev/shm, and `rdma-netns doctor
// --pid` says why, from what the plugin wrote on the container.
func TestBadShmSizeInDoctor(t *testing.T) {
	exclusiveOnly(t)
	pod := runPod(t, cririg.PodSpec{Name: "nri-bad-size", Handler: "rdma-eth2", Annotations: map[string]string{"rdma-netns.io/shm-size": "2 gigs"}})
	c := runContainer(t, pod, unprivileged("worker"))
	wantAdjusted(t, c, 1<<20)
	findings, _ := runDoctor(t, "--pid", pidArg(t, c))
	for _, f := range findings {
		if f.Check == "nri-warnings" && strings.Contains(f.Reason, "rdma-netns.io/shm-size") && strings.Contains(f.Reason, "2 gigs") {
			t.Logf("doctor --pid: %s %s: %s", f.Severity, f.Check, f.Reason)
			return
		}
	}
	t.Fatalf("doctor --pid does not say why the pod's shm-size was ignored: %+v", findings)
}
