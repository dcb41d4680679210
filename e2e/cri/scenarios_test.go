//go:build e2e

package cri_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
)

// In exclusive mode the default network's chain, which has rdma-netns,
// answers STATUS, and containerd reports the network ready.
func TestNetworkReady(t *testing.T) {
	cririg.SkipUnlessExclusive(t)
	before := countCalls(t, "rdma-netns", "STATUS")
	ready, reason, msg, err := ctd.NetworkReady(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if !ready {
		t.Fatalf("NetworkReady false: %s: %s", reason, msg)
	}
	if after := countCalls(t, "rdma-netns", "STATUS"); after <= before {
		t.Fatalf("CRI Status made no rdma-netns STATUS call (%d before, %d after)", before, after)
	}
}

// In shared mode rdma-netns's STATUS fails and containerd says why.
func TestSharedModeNetworkNotReady(t *testing.T) {
	if cririg.NetnsMode() != "shared" {
		t.Skip("the shared-mode VM's test")
	}
	ready, reason, msg, err := ctd.NetworkReady(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NetworkReady=%v reason %q message %q", ready, reason, msg)
	if ready {
		t.Fatal("NetworkReady true on a node in shared RDMA netns mode")
	}
	if !strings.Contains(msg, "rdma-netns is not ready") || !strings.Contains(msg, "shared") {
		t.Fatalf("NetworkReady message does not carry rdma-netns's STATUS error: %q", msg)
	}
}

// tools is a pod of the suite with its workload container.
type tools struct {
	pod *cririg.Pod
	ctr *cririg.Container
	net cririg.Network
}

// runTools runs a pod on handler's network with a tools container given
// the pod's RDMA device nodes and IPC_LOCK, as a device plugin and a pod
// spec would.
func runTools(t *testing.T, name, handler string) tools {
	t.Helper()
	n := cririg.MustNetworkOf(t, handler)
	pod, err := ctd.RunPod(ctx(t), cririg.PodSpec{Name: name, Namespace: "rdma-test", Handler: handler})
	if err != nil {
		t.Fatal(err)
	}
	return toolsIn(t, pod, n)
}

// toolsIn checks that pod holds its network's RDMA device and runs the
// tools container in it, with the device's nodes and IPC_LOCK.
func toolsIn(t *testing.T, pod *cririg.Pod, n cririg.Network) tools {
	t.Helper()
	podHolds(t, pod, n.RDMA)
	devs, err := cririg.VerbsDevices(pod.Netns, n.RDMA)
	if err != nil {
		t.Fatal(err)
	}
	ctr, err := ctd.RunContainer(ctx(t), pod, cririg.ContainerSpec{Name: "tools", Devices: devs, AddCaps: []string{"IPC_LOCK"}})
	if err != nil {
		t.Fatal(err)
	}
	return tools{pod, ctr, n}
}

func (p tools) exec(t *testing.T, timeout time.Duration, argv ...string) string {
	t.Helper()
	r, err := ctd.Exec(ctx(t), p.ctr, timeout, argv...)
	if err != nil {
		t.Fatal(err)
	}
	return r.Stdout
}

// stop stops and removes the pod, as kubelet does when it is deleted.
func (p tools) stop(t *testing.T) {
	t.Helper()
	if err := ctd.StopPod(ctx(t), p.pod.ID); err != nil {
		t.Fatal(err)
	}
	if err := ctd.RemovePod(ctx(t), p.pod.ID); err != nil {
		t.Fatal(err)
	}
}

// Two pods on two runtime handlers each get their NIC's RDMA device; their
// containers see only their own and exchange verbs traffic; stopping and
// removing them brings both devices back, with no record left.
func TestPodsExchangeTraffic(t *testing.T) {
	cririg.SkipUnlessExclusive(t)
	a := runTools(t, "rdma-a", "rdma-eth1")
	b := runTools(t, "rdma-b", "rdma-eth2")

	for _, p := range []tools{a, b} {
		out := p.exec(t, 30*time.Second, "ibv_devices")
		if !strings.Contains(out, p.net.RDMA) {
			t.Fatalf("ibv_devices in %s does not list its %s:\n%s", p.pod.Spec.Name, p.net.RDMA, out)
		}
		for _, other := range []tools{a, b} {
			if other.net.RDMA != p.net.RDMA && strings.Contains(out, other.net.RDMA) {
				t.Fatalf("ibv_devices in %s lists the other pod's %s:\n%s", p.pod.Spec.Name, other.net.RDMA, out)
			}
		}
		status := p.exec(t, 10*time.Second, "cat", "/proc/self/status")
		if !hasCap(status, 14) { // CAP_IPC_LOCK
			t.Fatalf("container of %s lacks IPC_LOCK:\n%s", p.pod.Spec.Name, status)
		}
	}

	// The record names the pod containerd passed in CNI_ARGS.
	recs := records(t)
	for _, p := range []tools{a, b} {
		found := false
		for _, r := range recs {
			if r.Device == p.net.RDMA {
				found = true
				if r.K8sNamespace != "rdma-test" || r.K8sPod != p.pod.Spec.Name || r.ContainerID != p.pod.ID || r.IfName != "eth0" || r.Network != p.net.Name {
					t.Fatalf("record of %s: %+v, want pod rdma-test/%s, container %s, eth0, network %s", p.net.RDMA, r, p.pod.Spec.Name, p.pod.ID, p.net.Name)
				}
			}
		}
		if !found {
			t.Fatalf("no record of %s among %+v", p.net.RDMA, recs)
		}
	}

	pp, bw := ctd.MustExchange(t, ctx, a.endpoint(), b.endpoint(), 200)
	t.Logf("ibv_rc_pingpong %s -> %s: %d bytes, %d iters, %.2f usec/iter", b.net.RDMA, a.net.RDMA, pp.Bytes, pp.Iters, pp.UsecPerIter)
	t.Logf("ib_write_bw %s -> %s: %d iters of %d bytes, average %.2f MB/s", b.net.RDMA, a.net.RDMA, bw.Iters, bw.Bytes, bw.AverageMBps)

	a.stop(t)
	b.stop(t)
	waitHome(t, a.net.RDMA, b.net.RDMA)
	noRecords(t)

	// What containerd called for pod a: one ADD of each plugin of the
	// chain, a DEL with the netns on StopPodSandbox, one without on
	// RemovePodSandbox; CNI_IFNAME eth0 and the pod in CNI_ARGS.
	calls := callsFor(t, "rdma-netns", a.pod.ID)
	if got := commands(calls); got != "ADD DEL DEL(no netns)" {
		t.Errorf("rdma-netns calls for pod a: %s, want ADD DEL DEL(no netns)", got)
	}
	for _, c := range calls {
		if c.IfName != "eth0" || c.Args["K8S_POD_NAMESPACE"] != "rdma-test" || c.Args["K8S_POD_NAME"] != "rdma-a" || c.Args["K8S_POD_INFRA_CONTAINER_ID"] != a.pod.ID {
			t.Errorf("rdma-netns %s: ifname %s, CNI_ARGS %v", c.Command, c.IfName, c.Args)
		}
	}
}

func hasCap(status string, bit uint) bool {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && n&(1<<bit) != 0
		}
	}
	return false
}

func (p tools) endpoint() cririg.Endpoint { return cririg.Endpoint{Ctr: p.ctr, Net: p.net} }
