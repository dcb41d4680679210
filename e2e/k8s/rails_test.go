//go:build e2e

package k8s

// Rails: one pod per node holding several RDMA NICs (one per GPU on a real
// node), as NCCL and UCX spread a job over them. The two-node pair boots
// with both fabric layouts at once (the Makefile's K8S_PAIR_OPTS):
// eth1 and eth2 of the two VMs rail-optimized (vm-run.sh --rails: NIC k of
// node 1 and NIC k of node 2 on a link of their own, nothing else on it,
// as with a switch per rail), eth3 and eth4 on the one shared segment;
// and the VMs leave ARP at the kernel's defaults (--arp-defaults), which a
// pod's new netns copies, as a real node's pods get them.

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
)

// rail is one rail as the pods see it and the nodes hold it.
type rail struct {
	network string // the NAD
	nic     string // the node's NIC, and its RDMA device on every node VM
	dev     string
	name    string // the device's name in the pod (rdmaDevName)
	subnet  int    // the rail's addresses are 10.99.<subnet>.<host+node>
	host    int
}

func (r rail) ip(node int) string { return fmt.Sprintf("10.99.%d.%d", r.subnet, r.host+node) }

// The rails of overlays/nad-rails (conf/nad-rails.yaml: a subnet per
// rail) and overlays/nad-rails-shared (conf/nad-rails-shared-subnet.yaml:
// one subnet, tuning and sbr chained into each rail), whose names the
// overlay makes rdma_s<k> so that one pod holds both kinds.
var (
	optimizedRails = []rail{
		{"rdma-rail0", "eth1", "rxe1", "rdma_r0", 10, 0},
		{"rdma-rail1", "eth2", "rxe2", "rdma_r1", 11, 0},
	}
	sharedRails = []rail{
		{"rdma-shared-rail0", "eth3", "rxe3", "rdma_s0", 20, 0},
		{"rdma-shared-rail1", "eth4", "rxe4", "rdma_s1", 20, 10},
	}
)

// railSize and railIters are each ib_write_bw's: 12,800 RoCE packets at
// the VMs' 1024-byte RoCE MTU.
const railSize, railIters = 65536, 200

// railWorkers are a job's two workers, one per node, holding rails.
type railWorkers struct {
	pods  [2]spanWorker
	rails []rail
}

// startRailWorkers starts one worker per node (name-0 on node 1, name-1
// on node 2) attached to every rail, in order (Multus names their netdevs
// net1, net2, ...), its addresses in its network selection elements, and
// waits for both to run, each seeing every rail's device by its name, which
// its node no longer holds. The workers may flush their neighbour tables
// (NET_ADMIN), as the rounds below do between runs.
func startRailWorkers(t *testing.T, name string, rails []rail) railWorkers {
	t.Helper()
	ws := railWorkers{pods: [2]spanWorker{{name + "-0", 1, ""}, {name + "-1", 2, ""}}, rails: rails}
	for _, w := range ws.pods {
		p := spanWorkerPod(w)
		var sel []string
		for _, r := range rails {
			sel = append(sel, fmt.Sprintf(`{"name":%q,"ips":["%s/24"]}`, r.network, r.ip(w.node)))
		}
		p.Annotations["k8s.v1.cni.cncf.io/networks"] = "[" + strings.Join(sel, ",") + "]"
		p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		createPod(t, p)
		t.Cleanup(func() { deletePod(t, workersNS, w.name, workersGrace) })
	}
	var want []string
	for _, r := range rails {
		want = append(want, r.name)
	}
	sort.Strings(want)
	for _, w := range ws.pods {
		d := waitRunning(t, workersNS, w.name, 3*time.Minute)
		out, stderr, err := execIn(t, workersNS, w.name, "worker", "ibv_devices")
		if err != nil {
			t.Fatalf("%s: exec ibv_devices: %v\n%s", w.name, err, stderr)
		}
		devs := verbsDevices(out)
		sort.Strings(devs)
		if strings.Join(devs, " ") != strings.Join(want, " ") {
			t.Fatalf("%s on node %d: ibv_devices lists %v, want %v:\n%s", w.name, w.node, devs, want, out)
		}
		t.Logf("%s Running on %s %s after create; sees %v", w.name, cluster.NodeName(w.node), d.Round(time.Second), devs)
		st := hostOf(t, w.node)
		for _, r := range rails {
			if rig.Contains(st.RDMA, r.dev) || rig.Contains(st.Links, r.nic) {
				t.Errorf("node %d still holds %s or %s with %s running: RDMA %v, links %v", w.node, r.dev, r.nic, w.name, st.RDMA, st.Links)
			}
		}
	}
	return ws
}

// ifname is rail k's netdev in the pods.
func ifname(k int) string { return "net" + strconv.Itoa(k+1) }

// stop deletes the workers and waits for every rail's device and NIC to
// be home on each node.
func (ws railWorkers) stop(t *testing.T) {
	t.Helper()
	for _, w := range ws.pods {
		deletePod(t, workersNS, w.name, workersGrace)
	}
	for _, w := range ws.pods {
		for _, r := range ws.rails {
			waitNodeHome(t, w.node, r.dev, r.nic)
		}
	}
}

// railCounters are one pod's packet counters of one rail: its RDMA
// device's (rxe's hw_counters) and its netdev's.
type railCounters struct{ rdmaSent, rdmaRcvd, netTx, netRx int64 }

func (c railCounters) minus(o railCounters) railCounters {
	return railCounters{c.rdmaSent - o.rdmaSent, c.rdmaRcvd - o.rdmaRcvd, c.netTx - o.netTx, c.netRx - o.netRx}
}

// counters reads every rail's counters in w's pod, as its sysfs shows
// them.
func (ws railWorkers) counters(t *testing.T, w spanWorker) []railCounters {
	t.Helper()
	var files []string
	for k, r := range ws.rails {
		hw := "/sys/class/infiniband/" + r.name + "/ports/1/hw_counters/"
		st := "/sys/class/net/" + ifname(k) + "/statistics/"
		files = append(files, hw+"sent_pkts", hw+"rcvd_pkts", st+"tx_packets", st+"rx_packets")
	}
	out, stderr, err := execIn(t, workersNS, w.name, "worker", append([]string{"cat"}, files...)...)
	if err != nil {
		t.Fatalf("%s: reading the rails' counters: %v\n%s", w.name, err, stderr)
	}
	f := strings.Fields(out)
	if len(f) != len(files) {
		t.Fatalf("%s: %d counters, want %d: %q", w.name, len(f), len(files), out)
	}
	n := make([]int64, len(f))
	for i, s := range f {
		if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("%s: %s: %q", w.name, files[i], s)
		}
	}
	var cs []railCounters
	for k := range ws.rails {
		cs = append(cs, railCounters{n[4*k], n[4*k+1], n[4*k+2], n[4*k+3]})
	}
	return cs
}

// flushNeighbours empties both workers' neighbour tables: the next run
// asks ARP again, and on a shared segment every rail's answer races again.
func (ws railWorkers) flushNeighbours(t *testing.T) {
	t.Helper()
	for _, w := range ws.pods {
		for k := range ws.rails {
			if _, stderr, err := execIn(t, workersNS, w.name, "worker", "busybox", "ip", "neigh", "flush", "dev", ifname(k)); err != nil {
				t.Fatalf("%s: busybox ip neigh flush dev %s: %v\n%s", w.name, ifname(k), err, stderr)
			}
		}
	}
}

// railRun is one rail's stream of a round: what ib_write_bw said and the
// packets each end counted.
type railRun struct {
	bw         rig.WriteBW
	err        error
	want       int64 // the stream's RoCE packets: bytes / RoCE MTU
	sent, rcvd railCounters
}

// mtuLine is the RoCE MTU perftest reports it used.
var mtuLine = regexp.MustCompile(`Mtu\s*:\s*(\d+)\s*\[B\]`)

// round runs ib_write_bw on every rail at once from cli into srv, each
// run opening its rail's device by its name, on a TCP port of its own,
// and stopped after limit, and returns each rail's run (one may fail: a
// stream whose packets go to another NIC retries until it gives up, or
// stalls). Each side's runs start from one exec (`sh -c`), the servers
// checked listening by one exec at a time: an exec costs seconds of the
// emulated node's CPU, and one per run and poll starved the runs.
func (ws railWorkers) round(t *testing.T, n int, srv, cli spanWorker, limit time.Duration) []railRun {
	t.Helper()
	srvBefore, cliBefore := ws.counters(t, srv), ws.counters(t, cli)
	secs := int(limit / time.Second)
	var srvRuns, cliRuns [][]string
	var ports []int
	for k, r := range ws.rails {
		// A port per rail and round: a server a failed run left
		// behind still holds its own.
		port := 18515 + 10*n + k
		ports = append(ports, port)
		p := []string{"-p", strconv.Itoa(port)}
		srvRuns = append(srvRuns, append(rig.WriteBWArgs(r.name, railSize, railIters, ""), p...))
		cliRuns = append(cliRuns, append(rig.WriteBWArgs(r.name, railSize, railIters, r.ip(srv.node)), p...))
	}
	c, cancel := context.WithTimeout(ctx(t), limit+2*time.Minute)
	defer cancel()
	srvDone := make(chan string, 1)
	go func() {
		o, e, _ := execCtx(c, workersNS, srv.name, "worker", "sh", "-c", inParallel(srvRuns, secs+15))
		srvDone <- o + e
	}()
	runs := make([]railRun, len(ws.rails))
	if err := waitListening(c, srv, ports); err != nil {
		for k := range runs {
			runs[k].err = err
		}
	} else {
		o, e, err := execCtx(c, workersNS, cli.name, "worker", "sh", "-c", inParallel(cliRuns, secs))
		cliOut := perRun(o+e, len(ws.rails))
		srvOut := perRun(<-srvDone, len(ws.rails))
		for k := range runs {
			runs[k].bw, runs[k].err = parseRun(cliOut[k], srvOut[k])
			if err != nil && runs[k].err == nil {
				runs[k].err = err
			}
		}
	}
	srvAfter, cliAfter := ws.counters(t, srv), ws.counters(t, cli)
	for k := range ws.rails {
		mtu := 1024
		if m := mtuLine.FindStringSubmatch(runs[k].bw.Output); m != nil {
			mtu, _ = strconv.Atoi(m[1])
		}
		runs[k].want = int64(railSize * railIters / mtu)
		runs[k].sent, runs[k].rcvd = cliAfter[k].minus(cliBefore[k]), srvAfter[k].minus(srvBefore[k])
	}
	return runs
}

// inParallel is a shell script that runs every argv at once, each under
// busybox's timeout (secs), and then prints each one's output and exit
// status after a line "@@run K". The outputs wait in /dev/shm, which
// every container has writable (the tools image has no /tmp).
func inParallel(argvs [][]string, secs int) string {
	var b strings.Builder
	for k, argv := range argvs {
		fmt.Fprintf(&b, "( busybox timeout %d %s; echo \"@@status $?\" ) > /dev/shm/rails-run-%d 2>&1 &\n", secs, strings.Join(argv, " "), k)
	}
	b.WriteString("wait\n")
	for k := range argvs {
		fmt.Fprintf(&b, "echo '@@run %d'; cat /dev/shm/rails-run-%d\n", k, k)
	}
	return b.String()
}

// perRun splits inParallel's output into each run's.
func perRun(out string, n int) []string {
	runs := make([]string, n)
	for _, part := range strings.Split(out, "@@run ")[1:] {
		num, rest, _ := strings.Cut(part, "\n")
		if k, err := strconv.Atoi(strings.TrimSpace(num)); err == nil && k < n {
			runs[k] = rest
		}
	}
	return runs
}

// parseRun reads one rail's ib_write_bw client and server output.
func parseRun(cli, srv string) (rig.WriteBW, error) {
	if !strings.Contains(cli, "@@status 0") || !strings.Contains(srv, "@@status 0") {
		return rig.WriteBW{Output: cli}, fmt.Errorf("ib_write_bw did not complete: client:\n%s\nserver:\n%s", cli, srv)
	}
	bw, err := rig.ParseWriteBW(cli)
	if err == nil && bw.Iters != railIters {
		err = fmt.Errorf("ib_write_bw: %d iterations, want %d:\n%s", bw.Iters, railIters, cli)
	}
	return bw, err
}

// waitListening waits until a server listens on every one of ports in
// w's pod.
func waitListening(c context.Context, w spanWorker, ports []int) error {
	var last string
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		tcp, _, err := execCtx(c, workersNS, w.name, "worker", "cat", "/proc/net/tcp", "/proc/net/tcp6")
		if err != nil {
			last = err.Error()
			continue
		}
		var missing []string
		for _, p := range ports {
			if !regexp.MustCompile(fmt.Sprintf(`:%04X 0+:0000 0A`, p)).MatchString(tcp) {
				missing = append(missing, strconv.Itoa(p))
			}
		}
		if len(missing) == 0 {
			return nil
		}
		last = "not listening on " + strings.Join(missing, ", ")
	}
	return fmt.Errorf("ib_write_bw servers in %s: %s after 90s", w.name, last)
}

// describe is a rail's run in one line.
func (run railRun) describe(r rail, srv, cli spanWorker) string {
	res := fmt.Sprintf("%.2f MB/s", run.bw.AverageMBps)
	if run.err != nil {
		res = "FAILED: " + firstLine(run.err.Error())
	}
	return fmt.Sprintf("%s (%s), node %d -> node %d: %s; stream %d packets: writer's device sent %d (netdev tx %d), reader's device received %d (netdev rx %d)",
		r.name, r.nic, cli.node, srv.node, res, run.want, run.sent.rdmaSent, run.sent.netTx, run.rcvd.rdmaRcvd, run.rcvd.netRx)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// kept fails t unless every rail's stream entered and left by that
// rail's NIC: it completed, the writer's device and netdev sent and the
// reader's received at least the stream's packets and at most 15 % more
// (rxe resends what went astray; a stream whose packets reached another
// rail's NIC shows as resends on its own rail and as an excess on the
// other's, since all rails run at once).
func (ws railWorkers) kept(t *testing.T, runs []railRun, srv, cli spanWorker) {
	t.Helper()
	for k, run := range runs {
		r := ws.rails[k]
		t.Logf("rail %s", run.describe(r, srv, cli))
		if run.err != nil {
			t.Errorf("rail %s, node %d -> node %d: %v", r.name, cli.node, srv.node, run.err)
			continue
		}
		hi := run.want + run.want*15/100
		for _, c := range []struct {
			what string
			n    int64
		}{
			{fmt.Sprintf("node %d's %s sent", cli.node, r.name), run.sent.rdmaSent},
			{fmt.Sprintf("node %d's %s transmitted", cli.node, ifname(k)), run.sent.netTx},
			{fmt.Sprintf("node %d's %s received", srv.node, r.name), run.rcvd.rdmaRcvd},
			{fmt.Sprintf("node %d's %s received", srv.node, ifname(k)), run.rcvd.netRx},
		} {
			if c.n < run.want || c.n > hi {
				t.Errorf("rail %s: %s %d packets, want %d to %d (its stream's %d, +15 %% for resends): the stream did not keep to its rail's NIC",
					r.name, c.what, c.n, run.want, hi, run.want)
			}
		}
	}
}

// arpOf reads net.ipv4.conf.<netdev>.arp_ignore and arp_announce in w's
// pod.
func (ws railWorkers) arpOf(t *testing.T, w spanWorker, netdev string) string {
	t.Helper()
	d := "/proc/sys/net/ipv4/conf/" + netdev + "/"
	out, stderr, err := execIn(t, workersNS, w.name, "worker", "cat", d+"arp_ignore", d+"arp_announce")
	if err != nil {
		t.Fatalf("%s: %v\n%s", w.name, err, stderr)
	}
	return strings.Join(strings.Fields(out), "/")
}

// crossedNeighbours lists the entries of cli's neighbour table that hold
// one of srv's rail addresses at the MAC of another of srv's rails: ARP
// flux, what sends a rail's RoCE packets to another rail's NIC.
func (ws railWorkers) crossedNeighbours(t *testing.T, srv, cli spanWorker) []string {
	t.Helper()
	macs := map[string]string{} // srv's rail address -> its netdev's MAC
	owner := map[string]string{}
	for k, r := range ws.rails {
		out, _, err := execIn(t, workersNS, srv.name, "worker", "cat", "/sys/class/net/"+ifname(k)+"/address")
		if err != nil {
			continue
		}
		mac := strings.TrimSpace(out)
		macs[r.ip(srv.node)] = mac
		owner[mac] = ifname(k)
	}
	out, _, err := execIn(t, workersNS, cli.name, "worker", "busybox", "ip", "neigh", "show")
	if err != nil {
		return nil
	}
	var crossed []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		for i := 0; i+1 < len(f); i++ {
			if f[i] != "lladdr" {
				continue
			}
			if want, ok := macs[f[0]]; ok && f[i+1] != want {
				crossed = append(crossed, fmt.Sprintf("%s holds %s at %s's MAC %s", cli.name, f[0], owner[f[i+1]], f[i+1]))
			}
		}
	}
	return crossed
}

// railFindings runs `rdma-netns doctor --pid` on node 1's worker (the
// doctor reads the pod's netns on its node) and returns its findings of
// the rails checks, logging its text.
func (ws railWorkers) railFindings(t *testing.T) []doctor.Finding {
	t.Helper()
	pid := strconv.Itoa(containerPidOf(t, ws.pods[0].name))
	bin := cririg.CNIBinDir + "/rdma-netns"
	if text, _, err := doctorrun.Text(bin, "--pid", pid); err == nil {
		t.Logf("rdma-netns doctor --pid %s (%s):\n%s", pid, ws.pods[0].name, text)
	}
	r, _, err := doctorrun.JSON(bin, "--pid", pid)
	if err != nil {
		t.Fatal(err)
	}
	var out []doctor.Finding
	for _, f := range r.Findings {
		if strings.HasPrefix(f.Check, "rail") {
			out = append(out, f)
		}
	}
	return out
}

// railsJob is the rails' part of TestTwoNodes.
//
// One pod per node holds four rails: two rail-optimized (a subnet and a
// link each) and two sharing a subnet and the segment, whose NADs chain
// tuning (arp_ignore=1, arp_announce=2 on the rail's netdev) and sbr (a
// routing table per rail) as conf/nad-rails-shared-subnet.yaml does. In
// two rounds, the neighbour tables flushed between them, one each way,
// ib_write_bw runs on all four rails at once, and every rail's stream
// keeps to its NIC; the doctor finds nothing wrong with the rails.
//
// Then the shared rails without the chain, at the kernel's ARP defaults:
// over rounds with the neighbour tables flushed between them, what
// happens is logged (it is a race between two ARP answers: a crossed
// neighbour entry, resends, a stream that stalls), and the doctor must
// name the rails' ARP settings. Deleted, every rail's device and NIC are
// home on both nodes.
func railsJob(t *testing.T) {
	if node.Rails < len(optimizedRails) || !node.ARPDefaults {
		t.Skipf("the pair booted with %d rails of their own and ARP defaults %v: the rails need --rails %d --arp-defaults and %d NICs (the Makefile's K8S_PAIR_OPTS and K8S_PAIR_NICS)",
			node.Rails, node.ARPDefaults, len(optimizedRails), 1+len(optimizedRails)+len(sharedRails))
	}
	applyManifest(t, "nad-rails")
	applyManifest(t, "nad-rails-shared")
	ws := startRailWorkers(t, "rails", append(append([]rail{}, optimizedRails...), sharedRails...))
	for k := len(optimizedRails); k < len(ws.rails); k++ {
		if got := ws.arpOf(t, ws.pods[0], ifname(k)); got != "1/2" {
			t.Errorf("%s: arp_ignore/arp_announce of %s %s, want 1/2 (the NAD's tuning)", ws.pods[0].name, ifname(k), got)
		}
	}
	for n, dir := range [][2]spanWorker{{ws.pods[0], ws.pods[1]}, {ws.pods[1], ws.pods[0]}} {
		if n > 0 {
			ws.flushNeighbours(t)
		}
		ws.kept(t, ws.round(t, n, dir[0], dir[1], 2*time.Minute), dir[0], dir[1])
	}
	for _, f := range ws.railFindings(t) {
		if f.Severity != doctor.OK {
			t.Errorf("doctor on rails kept apart: %s %s %s: %s", f.Severity, f.Check, f.Subject, f.Reason)
		}
	}
	ws.stop(t)

	applyManifest(t, "nad-rails-shared-bare")
	ws = startRailWorkers(t, "bare", sharedRails)
	if got := ws.arpOf(t, ws.pods[0], "all") + " " + ws.arpOf(t, ws.pods[0], ifname(0)); got != "0/0 0/0" {
		t.Fatalf("%s: arp_ignore/arp_announce (all, net1) %s, want the kernel's 0/0 0/0: the pair must boot with --arp-defaults (K8S_PAIR_OPTS)", ws.pods[0].name, got)
	}
	const rounds = 3
	kept := 0
	for n := range rounds {
		srv, cli := ws.pods[n%2], ws.pods[1-n%2]
		ws.flushNeighbours(t)
		runs := ws.round(t, n, srv, cli, 45*time.Second)
		ok := true
		for k, run := range runs {
			t.Logf("at the kernel's ARP defaults, round %d: rail %s", n+1, run.describe(ws.rails[k], srv, cli))
			hi := run.want + run.want*15/100
			ok = ok && run.err == nil && run.sent.rdmaSent <= hi && run.rcvd.rdmaRcvd >= run.want && run.rcvd.rdmaRcvd <= hi
		}
		if crossed := ws.crossedNeighbours(t, srv, cli); len(crossed) > 0 {
			t.Logf("round %d: ARP flux: %s", n+1, strings.Join(crossed, "; "))
		}
		if ok {
			kept++
		}
	}
	t.Logf("at the kernel's ARP defaults, without tuning and sbr: %d of %d rounds kept every stream on its rail", kept, rounds)
	var named bool
	for _, f := range ws.railFindings(t) {
		named = named || f.Check == "rail-arp" && f.Severity == doctor.Fail
	}
	if !named {
		t.Errorf("doctor on rails sharing a subnet at arp_ignore 0: no rail-arp FAIL")
	}
	ws.stop(t)
}
