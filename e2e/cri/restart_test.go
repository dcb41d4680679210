//go:build e2e

package cri_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// keepRunning starts containerd again if a failed test left it dead, so
// that the tests after it still run.
func keepRunning(t *testing.T) {
	if ctd.Alive() {
		return
	}
	var err error
	if ctd, err = cririg.Start(ctd.Opts); err != nil {
		t.Errorf("restart containerd after the test: %v", err)
	}
}

// restart SIGKILLs containerd and starts it again, as a crash and systemd
// would, keeping the new one for the tests that follow.
func restart(t *testing.T) {
	t.Helper()
	t.Cleanup(func() { keepRunning(t) })
	if err := ctd.Kill(); err != nil {
		t.Fatal(err)
	}
	var err error
	if ctd, err = cririg.Start(ctd.Opts); err != nil {
		t.Fatal(err)
	}
}

// Pods outlive their runtime: SIGKILLed containerd leaves the sandboxes
// and their devices in place, the restarted one makes no CNI call and finds
// them ready, and StopPodSandbox after the restart returns the devices.
func TestKilledWithPodsRunning(t *testing.T) {
	cririg.SkipUnlessExclusive(t)
	a := runTools(t, "keep-a", "rdma-eth1")
	b := runTools(t, "keep-b", "rdma-eth2")
	before, err := cririg.Calls()
	if err != nil {
		t.Fatal(err)
	}

	restart(t)
	podHolds(t, a.pod, a.net.RDMA)
	podHolds(t, b.pod, b.net.RDMA)
	after, err := cririg.Calls()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range after[len(before):] {
		if c.Command != "STATUS" {
			t.Errorf("containerd's restart called %s %s for %s", c.Plugin, c.Command, c.ContainerID)
		}
	}
	for _, p := range []tools{a, b} {
		st, err := ctd.Runtime.PodSandboxStatus(ctx(t), &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.pod.ID})
		if err != nil {
			t.Fatal(err)
		}
		if st.Status.State != runtimeapi.PodSandboxState_SANDBOX_READY {
			t.Fatalf("pod %s after the restart: %v", p.pod.Spec.Name, st.Status.State)
		}
		// The container still runs and still has its device.
		if out := p.exec(t, 30*time.Second, "ibv_devices"); !strings.Contains(out, p.net.RDMA) {
			t.Fatalf("ibv_devices in %s after the restart:\n%s", p.pod.Spec.Name, out)
		}
	}
	a.stop(t)
	b.stop(t)
	waitHome(t, a.net.RDMA, b.net.RDMA)
	noRecords(t)
}

// containerd SIGKILLed in the middle of RunPodSandbox, while rdma-netns's
// ADD runs: the ADD completes on its own (the device goes into the pod; the
// plugin dies of SIGPIPE writing the result nobody reads), the restarted
// containerd lists the half-made sandbox, and stopping and removing it, as
// kubelet does with pods it did not ask for, brings the device home.
//
// containerd tears a sandbox's network down only when it stored a CNI
// result, which a sandbox whose ADD it never saw finish lacks: it makes no
// DEL and removes the netns, and the kernel returns the devices (the NIC
// under a name of the kernel's choosing). rdma-netns's record of that
// attachment is then stale; the next ADD drops it, which the pod started
// afterwards shows. `rdma-netns-cri stress` repeats this at random points.
func TestKilledDuringRunPodSandbox(t *testing.T) {
	cririg.SkipUnlessExclusive(t)
	n := cririg.MustNetworkOf(t, "rdma-eth1")
	if err := cririg.Hold("rdma-netns", "ADD"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cririg.Release("rdma-netns", "ADD")
		keepRunning(t)
	})
	runErr := make(chan error, 1)
	go func() {
		_, err := ctd.RunPod(ctx(t), cririg.PodSpec{Name: "killed", Namespace: "rdma-test", Handler: "rdma-eth1"})
		runErr <- err
	}()
	id, err := cririg.WaitHeld("rdma-netns", "ADD", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := ctd.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := <-runErr; err == nil {
		t.Fatal("RunPodSandbox succeeded although containerd was killed during it")
	}
	if err := cririg.Release("rdma-netns", "ADD"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cririg.WaitCallsDone(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The orphaned ADD did its work: the device is in the pod, recorded.
	recorded := false
	for _, r := range records(t) {
		recorded = recorded || (r.ContainerID == id && r.Device == n.RDMA)
	}
	if !recorded || rig.HostHas(t, n.RDMA) {
		t.Fatalf("after the orphaned ADD: recorded %v, %s on the host %v", recorded, n.RDMA, rig.HostHas(t, n.RDMA))
	}

	var startErr error
	if ctd, startErr = cririg.Start(ctd.Opts); startErr != nil {
		t.Fatal(startErr)
	}
	pods, err := ctd.Pods(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range pods {
		if p.Id == id {
			found = true
			t.Logf("the restarted containerd lists the half-made sandbox: %s", p.State)
		}
	}
	if !found {
		t.Fatalf("the restarted containerd does not list sandbox %s: %v", id, pods)
	}
	if err := ctd.Cleanup(ctx(t)); err != nil {
		t.Fatal(err)
	}
	waitHome(t, n.RDMA)
	if left := cniNetns(t); len(left) != 0 {
		t.Fatalf("network namespaces left after the cleanup: %v", left)
	}
	t.Logf("rdma-netns calls for the sandbox: %s", commands(callsFor(t, "rdma-netns", id)))
	links, _ := rig.NetdevsIn("")
	t.Logf("host netdevs after the cleanup: %v", links)
	nics, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	if missing, err := rig.WaitHome(nics, 10*time.Second); err != nil || len(missing) != 0 {
		t.Fatalf("not home: %v %v", missing, err)
	}

	// The stale record blocks nothing: the NIC's next pod gets the device,
	// and once it is gone no record is left.
	again := runTools(t, "after-kill", "rdma-eth1")
	again.stop(t)
	waitHome(t, n.RDMA)
	noRecords(t)
}

// cniNetns lists the netns containerd made that still exist.
func cniNetns(t *testing.T) []string {
	t.Helper()
	m, err := filepath.Glob("/run/netns/cni-*")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// What containerd does that cnitool does not: StopPodSandbox again on a
// stopped pod, RemovePodSandbox's DEL without a netns (after the netns is
// gone), and the result it caches at ADD (libcni's cache, which DEL reads
// back as prevResult). All of it on the default network, whose conflist is
// /etc/cni/net.d's.
func TestDelAgainAndCachedResult(t *testing.T) {
	cririg.SkipUnlessExclusive(t)
	n := cririg.MustNetworkOf(t, "")
	pod, err := ctd.RunPod(ctx(t), cririg.PodSpec{Name: "default-net", Namespace: "rdma-test"})
	if err != nil {
		t.Fatal(err)
	}
	podHolds(t, pod, n.RDMA)
	cache := filepath.Join("/var/lib/cni/results", n.Name+"-"+pod.ID+"-eth0")
	data, err := os.ReadFile(cache)
	if err != nil {
		t.Fatalf("containerd cached no result: %v", err)
	}
	if !strings.Contains(string(data), n.IP) {
		t.Fatalf("cached result %s lacks the pod's address %s:\n%s", cache, n.IP, data)
	}
	for i := 0; i < 2; i++ {
		if err := ctd.StopPod(ctx(t), pod.ID); err != nil {
			t.Fatalf("StopPodSandbox #%d: %v", i+1, err)
		}
		waitHome(t, n.RDMA)
	}
	for i := 0; i < 2; i++ {
		if err := ctd.RemovePod(ctx(t), pod.ID); err != nil {
			t.Fatalf("RemovePodSandbox #%d: %v", i+1, err)
		}
	}
	waitHome(t, n.RDMA)
	noRecords(t)
	if _, err := os.Stat(cache); !os.IsNotExist(err) {
		t.Fatalf("cached result %s still there after RemovePodSandbox: %v", cache, err)
	}
	calls := callsFor(t, "rdma-netns", pod.ID)
	t.Logf("rdma-netns calls for two StopPodSandbox and two RemovePodSandbox: %s", commands(calls))
	dels := 0
	for _, c := range calls {
		if c.Command == "DEL" {
			dels++
		}
	}
	if dels < 2 {
		t.Fatalf("rdma-netns got %d DELs, want at least StopPodSandbox's and RemovePodSandbox's: %s", dels, commands(calls))
	}
	if devs, _ := rig.RDMAIn(""); !rig.Contains(devs, n.RDMA) {
		t.Fatalf("%s not on the host: %v", n.RDMA, devs)
	}
}
