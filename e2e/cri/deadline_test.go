//go:build e2e

package cri_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// deadline is the RunPodSandbox deadline of the test below: kubelet's
// runtime-request-timeout (2 minutes by default) made short, yet long
// enough for host-device's ADD to reach rdma-netns's on a loaded TCG VM.
const deadline = 5 * time.Second

// kubelet's CRI deadline expires while rdma-netns's ADD runs (a slow NIC):
// containerd cancels RunPodSandbox, libcni SIGKILLs the running
// plugin, and containerd, still inside RunPodSandbox, DELs the whole chain
// with the netns (no prevResult: the ADD never finished), removes the netns
// and the sandbox, and then frees the pod's name; kubelet's retry gets
// "name is reserved" until then. The plugin is killed before its work (held
// before the real plugin runs) or after it (held once it has moved the
// device, written its record and its result): after it, rdma-netns's DEL
// finds its record and returns the device. Either way the devices are home
// before the retry, the retried pod gets its NIC and RDMA device and uses
// it, and stopping and removing it leaves no record.
func TestRunPodSandboxDeadline(t *testing.T) {
	cririg.SkipUnlessExclusive(t)
	for _, tc := range []struct{ name, hold string }{
		{"killed before its move", "ADD"},
		{"killed after its move", "ADD-RESULT"},
	} {
		t.Run(tc.name, func(t *testing.T) { deadlineDuringADD(t, tc.hold) })
	}
}

func deadlineDuringADD(t *testing.T, hold string) {
	n := cririg.MustNetworkOf(t, "rdma-eth1")
	spec := cririg.PodSpec{Name: "deadline", Namespace: "rdma-test", Handler: "rdma-eth1"}
	if err := cririg.Hold("rdma-netns", hold); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cririg.Release("rdma-netns", hold) })

	dctx, cancel := context.WithTimeout(ctx(t), deadline)
	_, err := ctd.RunPod(dctx, spec)
	cancel()
	if err == nil || !strings.Contains(err.Error(), "DeadlineExceeded") {
		t.Fatalf("RunPodSandbox with a %s deadline and rdma-netns's %s held: %v, want DeadlineExceeded", deadline, hold, err)
	}
	id, err := cririg.WaitHeld("rdma-netns", hold, time.Second)
	if err != nil {
		t.Fatalf("the deadline expired before rdma-netns's %s was held (a loaded machine?): %v", hold, err)
	}
	returned := time.Now()
	// containerd cleans up after its caller gave up; the held call stays
	// held (if containerd did not kill it, it never finishes).
	if err := cririg.Wait(30*time.Second, "containerd removing the sandbox's netns", func() (bool, error) {
		return len(cniNetns(t)) == 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cririg.WaitCallsDone(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("containerd's cleanup done %s after RunPodSandbox returned", time.Since(returned).Round(time.Millisecond))
	if err := cririg.Release("rdma-netns", hold); err != nil {
		t.Fatal(err)
	}

	// What containerd did: SIGKILLed the held call, DELed every plugin.
	killed, err := cririg.Killed()
	if err != nil {
		t.Fatal(err)
	}
	var killedHere []string
	for _, k := range killed {
		if k.ContainerID == id {
			killedHere = append(killedHere, k.Plugin+" "+k.Command)
		}
	}
	if len(killedHere) != 1 || killedHere[0] != "rdma-netns ADD" {
		t.Fatalf("SIGKILLed calls of the sandbox: %v, want [rdma-netns ADD]", killedHere)
	}
	for _, p := range []string{"loopback", "host-device", "static", "rdma-netns"} {
		if got := commands(callsFor(t, p, id)); got != "ADD DEL" {
			t.Errorf("%s calls for the cancelled sandbox: %q, want \"ADD DEL\" (DEL with the netns)", p, got)
		}
	}
	pods, err := ctd.Pods(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if p.Id == id {
			t.Errorf("containerd lists the cancelled sandbox: %s", p.State)
		}
	}
	// Everything is home before kubelet retries: the NIC under its own
	// name (host-device's DEL), the RDMA device, no record, no cached result.
	links, err := rig.NetdevsIn("")
	if err != nil {
		t.Fatal(err)
	}
	if !rig.Contains(links, n.Netdev) || !rig.HostHas(t, n.RDMA) {
		t.Fatalf("after the cancelled RunPodSandbox the host has netdevs %v (want %s) and %s: %v", links, n.Netdev, n.RDMA, rig.HostHas(t, n.RDMA))
	}
	noRecords(t)
	if _, err := os.Stat("/var/lib/cni/results/" + n.Name + "-" + id + "-eth0"); !os.IsNotExist(err) {
		t.Fatalf("a cached result for the cancelled sandbox: %v", err)
	}

	// kubelet's retry, with the same pod, until containerd frees its name.
	var pod *cririg.Pod
	reserved := 0
	if err := cririg.Wait(30*time.Second, "the retried RunPodSandbox", func() (bool, error) {
		pod, err = ctd.RunPod(ctx(t), spec)
		if err != nil && strings.Contains(err.Error(), "is reserved") {
			reserved++
			return false, err
		}
		return true, err
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("the retry: %d refused with \"name is reserved\", then sandbox %s", reserved, pod.ID)
	p := toolsIn(t, pod, n)
	if out := p.exec(t, 30*time.Second, "ibv_devices"); !strings.Contains(out, n.RDMA) {
		t.Fatalf("ibv_devices in the retried pod:\n%s", out)
	}
	p.stop(t)
	waitHome(t, n.RDMA)
	noRecords(t)
	if left := cniNetns(t); len(left) != 0 {
		t.Fatalf("network namespaces left: %v", left)
	}
	if links, err := rig.NetdevsIn(""); err != nil || !rig.Contains(links, n.Netdev) {
		t.Fatalf("%s not on the host after the retried pod: %v %v", n.Netdev, links, err)
	}
}
