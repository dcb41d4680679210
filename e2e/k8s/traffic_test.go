//go:build e2e

package k8s

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// ncclWorker is one of the two NCCL pods of the traffic test: the overlay
// it is made from, its NAD's overlay, that NAD's name and the VM NIC it
// names.
type ncclWorker struct {
	name, podOverlay, nadOverlay, network, nic string
	dev, ip                                    string // its RDMA device and net1's address, once Running
}

// conf/pod-nccl.yaml twice, on two NICs (conf/nad-host-device.yaml on eth1
// and, through a second overlay, on eth2): each worker, unprivileged with
// every capability dropped and no privilege escalation, sees only its own
// RDMA device, and the two exchange ibv_rc_pingpong (RC send/receive, as
// NCCL's IB transport) and ib_write_bw (one-sided RDMA writes), each
// opening its device by name, with every command run through the API
// server's exec (kubelet, containerd) as `kubectl exec` runs it.
func TestNCCLTraffic(t *testing.T) {
	const ns = workersNS
	workers := startWorkers(t)
	srv, cli := workers[0], workers[1]
	pp, err := rig.PingPongBetween(ctx(t), srv.peer(), cli.peer(), 4096, 100)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ibv_rc_pingpong %s (%s) -> %s (%s): %d bytes, %d iters in %.2f s, %.0f usec/iter",
		cli.name, cli.dev, srv.name, srv.dev, pp.Bytes, pp.Iters, pp.Seconds, pp.UsecPerIter)
	bw, err := rig.WriteBWBetween(ctx(t), srv.peer(), cli.peer(), 65536, 200)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ib_write_bw %s -> %s's memory: %d iters of %d bytes, average %.2f MB/s, peak %.2f MB/s",
		cli.name, srv.name, bw.Iters, bw.Bytes, bw.AverageMBps, bw.PeakMBps)
	stopWorkers(t, workers)
}

// workersNS is the NCCL workers' namespace (conf/pod-nccl.yaml's).
const workersNS = "default"

// workersGrace is `kubectl delete pod --grace-period=1`: the workers'
// `sleep infinity`, their PID 1, ignores SIGTERM, and the default 30 s
// would only be waited out.
var workersGrace = metav1.DeleteOptions{GracePeriodSeconds: new(int64(1))}

// startWorkers starts the two workers and waits for them to run, each
// with its device alone and net1's address; they are deleted when the
// test ends, if it has not stopped them.
func startWorkers(t *testing.T) []*ncclWorker {
	t.Helper()
	workers := []*ncclWorker{
		{name: "nccl-worker-0", podOverlay: "pod-nccl", nadOverlay: "nad-host-device", network: "rdma-net", nic: "eth1"},
		{name: "nccl-worker-1", podOverlay: "pod-nccl-eth2", nadOverlay: "nad-host-device-eth2", network: "rdma-net-eth2", nic: "eth2"},
	}
	const ns = workersNS
	for _, w := range workers {
		w.dev = rdmaOf(t, w.nic)
		applyManifest(t, w.nadOverlay)
		applyManifest(t, w.podOverlay)
	}
	for _, w := range workers {
		t.Cleanup(func() { deletePod(t, ns, w.name, workersGrace) })
	}
	for _, w := range workers {
		waitRunning(t, ns, w.name, 3*time.Minute)
		status, raw := networkStatus(t, ns, w.name)
		net1 := attachment(status, ns+"/"+w.network, "net1")
		if net1 == nil || len(net1.IPs) == 0 {
			t.Fatalf("%s: network-status has no net1 with an address:\n%s", w.name, raw)
		}
		w.ip = net1.IPs[0]
		checkWorker(t, ns, w)
	}
	return workers
}

// peer is the worker as the traffic helpers drive it: through the API
// server's exec, as `kubectl exec` runs its commands.
func (w *ncclWorker) peer() rig.Peer {
	return rig.Peer{Run: execRunner(workersNS, w.name, "nccl"), Dev: w.dev, IP: w.ip}
}

// stopWorkers deletes the workers, both deletes issued before either is
// awaited, and waits for their devices to be back on the node.
func stopWorkers(t *testing.T, workers []*ncclWorker) {
	t.Helper()
	for _, w := range workers {
		if err := cs.CoreV1().Pods(workersNS).Delete(ctx(t), w.name, workersGrace); err != nil {
			t.Fatal(err)
		}
	}
	for _, w := range workers {
		deletePod(t, workersNS, w.name, workersGrace)
		waitHome(t, w.dev)
	}
}

// checkWorker: the worker's container runs with no capability and no
// privilege escalation, and lists its own RDMA device alone, which the
// node no longer has.
func checkWorker(t *testing.T, ns string, w *ncclWorker) {
	t.Helper()
	if rig.HostHas(t, w.dev) {
		t.Errorf("%s: %s is still in the node's netns with the pod running", w.name, w.dev)
	}
	out, stderr, err := execIn(t, ns, w.name, "nccl", "ibv_devices")
	if err != nil {
		t.Fatalf("%s: exec ibv_devices: %v\n%s", w.name, err, stderr)
	}
	if devs := verbsDevices(out); len(devs) != 1 || devs[0] != w.dev {
		t.Errorf("%s: ibv_devices lists %v, want [%s] alone:\n%s", w.name, devs, w.dev, out)
	}
	out, stderr, err = execIn(t, ns, w.name, "nccl", "cat", "/proc/self/status")
	if err != nil {
		t.Fatalf("%s: exec cat /proc/self/status: %v\n%s", w.name, err, stderr)
	}
	for _, want := range []string{"CapEff:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("%s: the container's process status lacks %q:\n%s", w.name, want, grepLines(out, strings.SplitN(want, ":", 2)[0]))
		}
	}
}
