//go:build e2e

package e2e

// Real RDMA traffic between pods: what users ask ("will NCCL/MPI in my pod
// work?"). Each pod gets a NIC and its RDMA device from the chain, then runs
// Debian's verbs tools against the other pod, the way NCCL's IB transport
// uses a device: by name, over RoCEv2, with registered memory.

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
)

// Generous: the VM emulates its CPUs (TCG) on a shared host; a ping-pong
// round trip takes about 30 ms there.
const trafficTimeout = 3 * time.Minute

// trafficPod is a pod given a NIC and its RDMA device by the chain, with
// what a verbs workload in it needs to reach another pod.
type trafficPod struct {
	*pod
	ep rig.Endpoint
	c  *libcni.CNIConfig
	l  *libcni.NetworkConfigList
}

// attachTrafficPod runs the chain for NIC n in a new pod. The workload
// opens the device under its original name, or under rdmaDevName when the
// chain renames it.
func attachTrafficPod(t *testing.T, id string, n nic, addr int, rdma map[string]any) *trafficPod {
	t.Helper()
	p := &trafficPod{pod: newPod(t, id), c: cni(t)}
	p.l = chain(t, "rdma-traffic", n.Netdev, addr, rdma)
	mustAdd(t, p.c, p.l, p.rt("net1"))
	dev := n.RDMA
	if name, ok := rdma["rdmaDevName"].(string); ok {
		dev = name
	}
	p.ep = rig.Endpoint{Netns: p.path(), Dev: dev, IP: rig.ChainIP(addr)}
	return p
}

func (p *trafficPod) del(t *testing.T) { mustDel(t, p.c, p.l, p.rt("net1")) }

// twoNICs returns two NICs with different sysfs layouts.
func twoNICs(t *testing.T) (nic, nic) { return nicBy(t, "pf"), nicBy(t, "child") }

// pingPong runs iters ibv_rc_pingpong round trips of size bytes between
// a (the server) and b (the client), and checks that both sides counted
// every one.
func pingPong(t *testing.T, a, b rig.Endpoint, size, iters int) {
	t.Helper()
	srv, cli, err := rig.RunPingPong(a, b, size, iters, trafficTimeout)
	if err != nil {
		t.Fatal(err)
	}
	for side, r := range map[string]rig.PingPong{"server": srv, "client": cli} {
		// Every iteration is a send and a receive of size bytes.
		if r.Iters != iters || r.Bytes != int64(2*size*iters) {
			t.Errorf("ibv_rc_pingpong %s: %d iters, %d bytes; want %d iters, %d bytes", side, r.Iters, r.Bytes, iters, 2*size*iters)
		}
	}
	t.Logf("ibv_rc_pingpong: %d x %d B round trips in %.2f s, %.0f usec/iter", cli.Iters, size, cli.Seconds, cli.UsecPerIter)
}

// writeBW runs iters ib_write_bw RDMA writes of size bytes between a
// (the server) and b (the client), and checks that they all went
// through.
func writeBW(t *testing.T, a, b rig.Endpoint, size, iters int) {
	t.Helper()
	bw, err := rig.RunWriteBW(a, b, size, iters, trafficTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if bw.Bytes != size || bw.Iters != iters || bw.AverageMBps <= 0 {
		t.Errorf("ib_write_bw: %d B x %d at %.2f MB/s; want %d B x %d at > 0 MB/s\n%s", bw.Bytes, bw.Iters, bw.AverageMBps, size, iters, bw.Output)
	}
	t.Logf("ib_write_bw: %d x %d B RDMA writes, peak %.2f MB/s, average %.2f MB/s", bw.Iters, bw.Bytes, bw.PeakMBps, bw.AverageMBps)
}

// Two pods set up by the chain with no hints exchange RC sends and RDMA
// writes over their devices; DEL gives both back.
func TestTrafficBetweenPods(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := twoNICs(t)
	pa := attachTrafficPod(t, "traffic-a", a, 80, nil)
	pb := attachTrafficPod(t, "traffic-b", b, 81, nil)

	pingPong(t, pa.ep, pb.ep, 4096, 100)
	writeBW(t, pa.ep, pb.ep, 65536, 200)

	pa.del(t)
	pb.del(t)
	wantRDMA(t, a.RDMA, []string{""}, []string{pa.path()})
	wantRDMA(t, b.RDMA, []string{""}, []string{pb.path()})
	wantNoRecords(t)
}

// The workload selects its device by the name the pod asked for
// (rdmaDevName), as NCCL_IB_HCA does; the host name comes back on DEL.
func TestTrafficRenamedDevice(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := twoNICs(t)
	pa := attachTrafficPod(t, "traffic-name-a", a, 82, map[string]any{"rdmaDevName": "roce_a"})
	pb := attachTrafficPod(t, "traffic-name-b", b, 83, map[string]any{"rdmaDevName": "roce_b"})
	wantRDMA(t, "roce_a", []string{pa.path()}, []string{""})
	wantRDMA(t, "roce_b", []string{pb.path()}, []string{""})

	pingPong(t, pa.ep, pb.ep, 4096, 50)
	writeBW(t, pb.ep, pa.ep, 65536, 100)

	pa.del(t)
	pb.del(t)
	wantRDMA(t, a.RDMA, []string{""}, nil)
	wantRDMA(t, b.RDMA, []string{""}, nil)
	wantNoRecords(t)
}

// rdma_cm (what MPI and UCX connect with) works between pods: rping
// resolves the peer's address and route and connects through the devices
// the pods were given.
func TestTrafficRdmaCM(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := twoNICs(t)
	pa := attachTrafficPod(t, "traffic-cm-a", a, 93, nil)
	pb := attachTrafficPod(t, "traffic-cm-b", b, 94, nil)
	pings, err := rig.RunRping(pa.ep, pb.ep, 5, trafficTimeout)
	if err != nil {
		t.Fatal(err)
	}
	if pings != 5 {
		t.Fatalf("rping: %d pings verified, want 5", pings)
	}
	t.Logf("rping: %d pings over an rdma_cm connection", pings)
	pa.del(t)
	pb.del(t)
}

// A third pod asking for a device that carries traffic is refused, and the
// traffic does not notice: both sides keep sending afterwards.
func TestTrafficSurvivesRefusedAdd(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := twoNICs(t)
	third := otherNIC(t, a, b)
	pa := attachTrafficPod(t, "traffic-busy-a", a, 84, nil)
	pb := attachTrafficPod(t, "traffic-busy-b", b, 85, nil)

	srv, cli := endlessPingPong(t, pa, pb)
	waitSending(t, pb.ep, cli)

	c := cni(t)
	lc := chain(t, "rdma-traffic", third.Netdev, 86, map[string]any{"rdmaDevice": a.RDMA})
	pc := newPod(t, "traffic-intruder")
	_, err := add(t, c, lc, pc.rt("net1"))
	wantErrContains(t, err, a.RDMA, "rdma-traffic/traffic-busy-a/net1")
	mustDel(t, c, lc, pc.rt("net1"))
	wantRDMA(t, a.RDMA, []string{pa.path()}, []string{"", pc.path()})

	// Still running, and both devices still sending.
	killMidTraffic(t, pa, pb, srv, cli)
}

// endlessPingPong starts ibv_rc_pingpong between a (the server) and b
// (the client) for more round trips than a test lasts: the test stops it,
// or its cleanup does.
func endlessPingPong(t *testing.T, a, b *trafficPod) (srv, cli *rig.Proc) {
	t.Helper()
	const size, iters = 4096, 1000000
	srv, err := rig.StartServer(a.ep, rig.PingPongArgs(a.ep.Dev, size, iters, "")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Kill)
	cli, err = rig.Start(rig.InPod(b.ep.Netns, rig.PingPongArgs(b.ep.Dev, size, iters, a.ep.IP)...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cli.Kill)
	return srv, cli
}

// killMidTraffic waits until both devices are sending, then kills both
// sides of the exchange and deletes both pods, as kubelet does: no record
// is left.
func killMidTraffic(t *testing.T, a, b *trafficPod, srv, cli *rig.Proc) {
	t.Helper()
	waitSending(t, b.ep, cli)
	waitSending(t, a.ep, srv)
	cli.Kill()
	srv.Kill()
	a.del(t)
	b.del(t)
	wantNoRecords(t)
}

// otherNIC is a NIC that is neither a nor b.
func otherNIC(t *testing.T, a, b nic) nic {
	t.Helper()
	for _, n := range nics {
		if n.Netdev != a.Netdev && n.Netdev != b.Netdev {
			return n
		}
	}
	t.Fatal("the VM has no third NIC")
	return nic{}
}

// waitSending waits until the device has sent RoCE packets for p, so the
// traffic is really under way (the verbs examples print nothing until the
// end).
func waitSending(t *testing.T, ep rig.Endpoint, p *rig.Proc) {
	t.Helper()
	before, err := rig.SentPackets(ep)
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if p.Exited() {
			t.Fatalf("traffic ended early:\n%s", p.Output())
		}
		if n, err := rig.SentPackets(ep); err == nil && n > before+10 {
			return
		}
	}
	t.Fatalf("%s sent no RoCE packets within a minute", ep.Dev)
}

// Deleting a pod as kubelet does: its processes die mid-traffic, then the
// runtime calls DEL. The device returns to the host in a state the host can
// open and use again.
func TestTrafficPodKilledThenDel(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := twoNICs(t)
	pa := attachTrafficPod(t, "traffic-kill-a", a, 87, nil)
	pb := attachTrafficPod(t, "traffic-kill-b", b, 88, nil)

	srv, cli := endlessPingPong(t, pa, pb)
	killMidTraffic(t, pa, pb, srv, cli)

	for _, n := range []nic{a, b} {
		wantRDMA(t, n.RDMA, []string{""}, []string{pa.path(), pb.path()})
		// Opened and queried (ibv_open_device, ibv_query_port). The port
		// is DOWN: host-device hands the NIC back down.
		out, err := exec.Command("ibv_devinfo", "-d", n.RDMA).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "hca_id:\t"+n.RDMA+"\n") {
			t.Errorf("host cannot open %s after DEL: %v\n%s", n.RDMA, err, out)
		}
	}
	// And the devices carry traffic again in new pods.
	qa := attachTrafficPod(t, "traffic-kill-a2", a, 89, nil)
	qb := attachTrafficPod(t, "traffic-kill-b2", b, 90, nil)
	pingPong(t, qa.ep, qb.ep, 4096, 20)
	qa.del(t)
	qb.del(t)
}

// starvedWorkloadEnv makes the e2e binary a pod's workload with the
// container defaults that break RDMA: a 64KiB memlock limit and, for
// "starved", no CAP_IPC_LOCK ("ipclock" keeps it). It waits for its go-file
// to exist, then runs the command in starvedArgvEnv.
const (
	starvedWorkloadEnv = "RDMA_NETNS_TRAFFIC_WORKLOAD"
	starvedArgvEnv     = "RDMA_NETNS_TRAFFIC_ARGV"
	starvedGoEnv       = "RDMA_NETNS_TRAFFIC_GO"
)

// TestTrafficWorkloadProcess is not a test: it is the process
// startStarvedWorkload runs in a pod.
func TestTrafficWorkloadProcess(t *testing.T) {
	helperProcess(t, starvedWorkloadEnv, "traffic", becomeStarvedWorkload)
}

func becomeStarvedWorkload(kind string) error {
	var argv []string
	if err := json.Unmarshal([]byte(os.Getenv(starvedArgvEnv)), &argv); err != nil {
		return fmt.Errorf("argv: %w", err)
	}
	if err := limitMemlock(64<<10, kind == "starved"); err != nil {
		return err
	}
	// The pod's process exists (and doctor can inspect it) before the
	// workload starts, as with a container's entrypoint.
	script := `while [ ! -e "$0" ]; do sleep 0.1; done; exec "$@"`
	return syscall.Exec("/bin/sh", append([]string{"sh", "-c", script, os.Getenv(starvedGoEnv)}, argv...), os.Environ())
}

// startStarvedWorkload starts argv in the pod as a workload of the given
// kind, waiting for go() before it runs.
func startStarvedWorkload(t *testing.T, ep rig.Endpoint, kind string, argv []string) (p *rig.Proc, pid int, goAhead func()) {
	t.Helper()
	goFile := fmt.Sprintf("%s/go-%s-%d", t.TempDir(), kind, time.Now().UnixNano())
	cmd := rig.InPod(ep.Netns, os.Args[0], "-test.run=^TestTrafficWorkloadProcess$")
	js, _ := json.Marshal(argv)
	cmd.Env = append(os.Environ(), starvedWorkloadEnv+"="+kind, starvedArgvEnv+"="+string(js), starvedGoEnv+"="+goFile)
	p, err := rig.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Kill)
	pid = cmd.Process.Pid
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); strings.TrimSpace(string(comm)) == "sh" {
			break
		}
		if p.Exited() || time.Now().After(deadline) {
			t.Fatalf("workload did not start: %s", p.Output())
		}
	}
	return p, pid, func() {
		if err := os.WriteFile(goFile, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The field failure NCCL reports as "ibv_reg_mr failed": a pod without
// IPC_LOCK and the container's 64KiB memlock limit. doctor names it before
// the workload runs; the workload then cannot register its buffer, while
// the same pod with IPC_LOCK runs.
func TestTrafficStarvedMemlock(t *testing.T) {
	requireMode(t, "exclusive")
	a, b := twoNICs(t)
	pa := attachTrafficPod(t, "traffic-mem-a", a, 91, nil)
	pb := attachTrafficPod(t, "traffic-mem-b", b, 92, nil)
	const size, iters = 1 << 20, 5

	for _, kind := range []string{"starved", "ipclock"} {
		srv, err := rig.StartServer(pa.ep, rig.PingPongArgs(pa.ep.Dev, size, iters, "")...)
		if err != nil {
			t.Fatal(err)
		}
		cli, pid, goAhead := startStarvedWorkload(t, pb.ep, kind, rig.PingPongArgs(pb.ep.Dev, size, iters, pa.ep.IP))
		r, code := runDoctor(t, "--pid", strconv.Itoa(pid))
		fails := failures(r, "memlock", fmt.Sprintf("pid %d", pid))
		goAhead()
		cout, cerr := cli.Wait(trafficTimeout)
		if kind == "starved" {
			if code != 1 || len(fails) == 0 {
				t.Errorf("doctor --pid on a pod without IPC_LOCK and 64KiB memlock: exit %d, want 1 with a FAIL memlock finding; findings:\n%s", code, dumpFindings(r))
			}
			if cerr == nil || !strings.Contains(cout, "Couldn't register MR") {
				t.Errorf("starved workload: %v, want \"Couldn't register MR\":\n%s", cerr, cout)
			}
			t.Logf("starved workload: %v: %s", cerr, strings.TrimSpace(cout))
			srv.Kill()
			continue
		}
		if len(fails) > 0 {
			t.Errorf("doctor --pid on a pod with IPC_LOCK: memlock FAIL:\n%s", dumpFindings(r))
		}
		sout, serr := srv.Wait(30 * time.Second)
		if cerr != nil || serr != nil {
			t.Fatalf("pod with IPC_LOCK: client %v\n%s\nserver %v\n%s", cerr, cout, serr, sout)
		}
		c, err := rig.ParsePingPong(cout)
		if err != nil || c.Iters != iters {
			t.Errorf("pod with IPC_LOCK: %+v, %v", c, err)
		}
		t.Logf("with IPC_LOCK: %d x 1 MiB round trips in %.2f s", c.Iters, c.Seconds)
	}
	pa.del(t)
	pb.del(t)
}

func failures(r *doctor.Report, check, subjectPrefix string) []doctor.Finding {
	var out []doctor.Finding
	for _, f := range findings(r, check, subjectPrefix) {
		if f.Severity == doctor.Fail {
			out = append(out, f)
		}
	}
	return out
}
