//go:build e2e

package k8s

// Rails: pods holding several RDMA NICs (one per GPU on a real node), as
// NCCL and UCX spread a job over them. make test boots the two-node pair
// with both fabric layouts at once (the Makefile's K8S_PAIR_OPTS): eth1
// and eth2 of the two VMs rail-optimized (vm-run.sh --rails: NIC k of
// node 1 and NIC k of node 2 on a link of their own, nothing else on it,
// as with a switch per rail), eth3 and eth4 on the one shared segment;
// and the VMs leave ARP at the kernel's defaults (--arp-defaults), which a
// pod's new netns copies, as a real node's pods get them. TestTwoNodes's
// job holds all four rails (by claim, claimRails; its rerun by the NADs
// naming them, jobRails); railsAtARPDefaults then shows what
// the shared rails do without the NAD's ARP and routing entries.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/railcount"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
)

// rail is one rail as the pods see it and the nodes hold it.
type rail struct {
	network string // the NAD
	nic     string // the node's NIC, on every node VM
	dev     string // its RDMA device on every node VM (withDevs)
	name    string // the device's name in the pod (rdmaDevName)
	subnet  int    // the rail's addresses are 10.99.<subnet>.<host+node>
	host    int
}

func (r rail) ip(node int) string { return fmt.Sprintf("10.99.%d.%d", r.subnet, r.host+node) }

// The rails of overlays/nad-rails (conf/nad-rails.yaml: a subnet per
// rail) and overlays/nad-rails-shared (conf/nad-rails-shared-subnet.yaml:
// one subnet, tuning and sbr chained into each rail), whose names the
// overlay makes rdma_s<k> so that one pod holds both kinds. Their devices
// come from the node's layout (withDevs).
var (
	optimizedRails = []rail{
		{network: "rdma-rail0", nic: "eth1", name: "rdma_r0", subnet: 10},
		{network: "rdma-rail1", nic: "eth2", name: "rdma_r1", subnet: 11},
	}
	sharedRails = []rail{
		{network: "rdma-shared-rail0", nic: "eth3", name: "rdma_s0", subnet: 20},
		{network: "rdma-shared-rail1", nic: "eth4", name: "rdma_s1", subnet: 20, host: 10},
	}
)

// withDevs is rails with each NIC's RDMA device as this node's layout
// names it (/run/rdma-layout), which every node VM of the pair shares:
// the VM names its last NIC's device as udev would (eth4's rocep0s7 with
// five NICs), the others rxe<k>.
func withDevs(t *testing.T, rails []rail) []rail {
	t.Helper()
	nics, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	out := slices.Clone(rails)
	for i, r := range out {
		k := slices.IndexFunc(nics, func(n rig.NIC) bool { return n.Netdev == r.nic })
		if k < 0 {
			t.Fatalf("rail %s: this node has no %s (%s): the rails need K8S_PAIR_NICS=%d", r.name, r.nic, rig.LayoutF, 1+len(optimizedRails)+len(sharedRails))
		}
		out[i].dev = nics[k].RDMA
	}
	return out
}

// railSize and railIters are each ib_write_bw's: 12,800 RoCE packets at
// the VMs' 1024-byte RoCE MTU.
const railSize, railIters = 65536, 200

// railWorkers are a job's two workers, one per node, holding rails.
type railWorkers struct {
	pods  [2]spanWorker
	rails []rail
	// claims: each worker holds its rails by a ResourceClaim
	// (startClaimJob), which its deletion must free.
	claims bool
}

// startRailWorkers starts one worker per node (name-0 on node 1, name-1
// on node 2) attached to every rail, in order (Multus names their netdevs
// net1, net2, ...), its addresses in its network selection elements, and
// waits for both to run, each seeing every rail's device by its name, which
// its node no longer holds; env is added to the worker container's. The
// workers may flush their neighbour tables (NET_ADMIN), as the rounds
// below do between runs.
func startRailWorkers(t *testing.T, name string, rails []rail, env ...corev1.EnvVar) railWorkers {
	t.Helper()
	return startRailWorkersOf(t, name, rails, func(w spanWorker) *corev1.Pod {
		p := spanWorkerPod(w)
		p.Spec.Containers[0].SecurityContext.Capabilities.Add = []corev1.Capability{"NET_ADMIN"}
		p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, env...)
		return p
	})
}

// startRailWorkersOf is startRailWorkers with pods made by podOf; each
// worker's ip is its first rail's address.
func startRailWorkersOf(t *testing.T, name string, rails []rail, podOf func(spanWorker) *corev1.Pod) railWorkers {
	t.Helper()
	ws := railWorkers{pods: [2]spanWorker{{name + "-0", 1, rails[0].ip(1)}, {name + "-1", 2, rails[0].ip(2)}}, rails: rails}
	for _, w := range ws.pods {
		p := podOf(w)
		var sel []string
		for _, r := range rails {
			sel = append(sel, fmt.Sprintf(`{"name":%q,"ips":["%s/24"]}`, r.network, r.ip(w.node)))
		}
		p.Annotations["k8s.v1.cni.cncf.io/networks"] = "[" + strings.Join(sel, ",") + "]"
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
// be home on each node, and, for workers holding claims, for the claims
// to be gone.
func (ws railWorkers) stop(t *testing.T) {
	t.Helper()
	deletePods(t, workersNS, workersGrace, ws.pods[0].name, ws.pods[1].name)
	for _, w := range ws.pods {
		for _, r := range ws.rails {
			waitNodeHome(t, w.node, r.dev, r.nic)
		}
	}
	if ws.claims {
		waitNoClaims(t)
	}
}

// railCounters are one pod's packet counters of one rail.
type railCounters = railcount.Counters

// inPods are the rails as the workers see them: each one's device by its
// name, its netdev by Multus's.
func (ws railWorkers) inPods() []railcount.Rail {
	rs := make([]railcount.Rail, len(ws.rails))
	for k, r := range ws.rails {
		rs[k] = railcount.Rail{Dev: r.name, Netdev: ifname(k)}
	}
	return rs
}

// counterFiles are the files of every rail's counters in a pod, four
// per rail in railCounters' order.
func (ws railWorkers) counterFiles() []string { return railcount.Files(ws.inPods()) }

// parseCounters reads counterFiles' contents, as cat prints them.
func (ws railWorkers) parseCounters(out string) ([]railCounters, error) {
	return railcount.Parse(out, len(ws.rails))
}

// counters reads every rail's counters in w's pod, as its sysfs shows
// them.
func (ws railWorkers) counters(t *testing.T, w spanWorker) []railCounters {
	t.Helper()
	out, stderr, err := execIn(t, workersNS, w.name, "worker", append([]string{"cat"}, ws.counterFiles()...)...)
	if err != nil {
		t.Fatalf("%s: reading the rails' counters: %v\n%s", w.name, err, stderr)
	}
	cs, err := ws.parseCounters(out)
	if err != nil {
		t.Fatalf("%s: the rails' counters: %v", w.name, err)
	}
	return cs
}

// countersNow reads every rail's counters in both workers.
func (ws railWorkers) countersNow(t *testing.T) [2][]railCounters {
	t.Helper()
	return [2][]railCounters{ws.counters(t, ws.pods[0]), ws.counters(t, ws.pods[1])}
}

// countersSince is what every rail of both workers counted since before
// (countersNow).
func (ws railWorkers) countersSince(t *testing.T, before [2][]railCounters) [2][]railCounters {
	t.Helper()
	var d [2][]railCounters
	for w, now := range ws.countersNow(t) {
		for k, c := range now {
			d[w] = append(d[w], c.Minus(before[w][k]))
		}
	}
	return d
}

// railRun is one rail's part of a round: its stream, if any, with the
// packets each end counted, and what ib_write_bw said.
type railRun struct {
	railcount.Stream
	bw rig.WriteBW
}

// mtuLine is the RoCE MTU perftest reports it used.
var mtuLine = regexp.MustCompile(`Mtu\s*:\s*(\d+)\s*\[B\]`)

// railPerftest are the options every rails run adds to ib_write_bw's
// (rig.WriteBWArgs): the queue pair's ACK timeout of NCCL's default
// (NCCL_IB_TIMEOUT 20, about 4 s) rather than perftest's 14 (67 ms),
// which a frame waiting its turn in the emulated link's buffer outlasts,
// so that the writer resends what was never lost.
var railPerftest = []string{"-u", "20"}

// railRound is what a round left: every rail's run, and where the
// writer sent its packets (its neighbour table after the runs, the
// reader's rails' MACs: crossedNeighbours).
type railRound struct {
	runs          []railRun
	cliNeighbours string   // the writer's `ip neigh show`
	srvMACs       []string // each rail's netdev's MAC in the reader
}

// round runs ib_write_bw at once on the rails of group (indices into
// ws.rails) from cli into srv, each run opening its rail's device by its
// name, on a TCP port of its own, and stopped after limit, and returns
// every rail's run, those outside group idle (one may fail: a stream
// whose packets go to another NIC retries until it gives up, or stalls).
// prep says what the sides do first. Each side's part is one exec
// (roundScript), the servers checked listening by one exec at a time: an
// exec costs seconds of the emulated node's CPU, and one per run, poll or
// counter read starved the runs and slowed the stage.
func (ws railWorkers) round(t *testing.T, n int, group []int, srv, cli spanWorker, limit time.Duration, prep roundPrep) railRound {
	t.Helper()
	secs := int(limit / time.Second)
	var srvRuns, cliRuns [][]string
	var ports []int
	for _, k := range group {
		r := ws.rails[k]
		// A port per rail and round: a server a failed run left
		// behind still holds its own.
		port := rig.PerftestPort + 10*n + k
		ports = append(ports, port)
		p := append([]string{"-p", strconv.Itoa(port)}, railPerftest...)
		srvRuns = append(srvRuns, append(rig.WriteBWArgs(r.name, railSize, railIters, ""), p...))
		cliRuns = append(cliRuns, append(rig.WriteBWArgs(r.name, railSize, railIters, r.ip(srv.node)), p...))
	}
	c, cancel := context.WithTimeout(ctx(t), limit+2*time.Minute)
	defer cancel()
	srvDone := make(chan string, 1)
	go func() {
		o, e, _ := execCtx(c, workersNS, srv.name, "worker", "sh", "-c", ws.roundScript(prep.flush, "", srvRuns, secs+15))
		srvDone <- withStderr(o, e)
	}()
	if err := waitListening(c, srv, ports, 90*time.Second); err != nil {
		execCtx(c, workersNS, srv.name, "worker", "busybox", "killall", "ib_write_bw")
		t.Fatalf("ib_write_bw servers: %v\n%s", err, <-srvDone)
	}
	o, e, err := execCtx(c, workersNS, cli.name, "worker", "sh", "-c", ws.roundScript(prep.flush, prep.cli, cliRuns, secs))
	cliOut := sections(withStderr(o, e))
	if !allCompleted(perRun(cliOut, len(group))) {
		// A server whose writer gave up would wait out its own limit for
		// nothing.
		execCtx(c, workersNS, srv.name, "worker", "busybox", "killall", "ib_write_bw")
	}
	srvOut := sections(<-srvDone)
	side := func(w spanWorker, out map[string]string) (before, after []railCounters) {
		if strings.Contains(out["flush"], "FAILED") {
			t.Fatalf("%s: busybox ip neigh flush: %s", w.name, out["flush"])
		}
		if strings.Contains(out["prep"], "FAILED") {
			t.Fatalf("%s: before round %d: %s", w.name, n, out["prep"])
		}
		var errB, errA error
		before, errB = ws.parseCounters(out["before"])
		after, errA = ws.parseCounters(out["after"])
		if err := errors.Join(errB, errA); err != nil {
			t.Fatalf("%s: the rails' counters around round %d: %v (stderr: %s)", w.name, n, err, out["stderr"])
		}
		return before, after
	}
	srvBefore, srvAfter := side(srv, srvOut)
	cliBefore, cliAfter := side(cli, cliOut)

	runs := make([]railRun, len(ws.rails))
	for k := range runs {
		runs[k].Idle = true
	}
	cliRunOut, srvRunOut := perRun(cliOut, len(group)), perRun(srvOut, len(group))
	mtu := 1024
	for i, k := range group {
		runs[k].Idle = false
		runs[k].bw, runs[k].Err = parseRun(cliRunOut[i], srvRunOut[i])
		if err != nil && runs[k].Err == nil {
			runs[k].Err = err
		}
		if m := mtuLine.FindStringSubmatch(runs[k].bw.Output); m != nil {
			mtu, _ = strconv.Atoi(m[1])
		}
	}
	for k := range ws.rails {
		runs[k].Want = int64(railSize * railIters / mtu)
		runs[k].Sent, runs[k].Rcvd = cliAfter[k].Minus(cliBefore[k]), srvAfter[k].Minus(srvBefore[k])
	}
	return railRound{runs: runs, cliNeighbours: cliOut["neighbours"], srvMACs: strings.Fields(srvOut["macs"])}
}

// roundPrep is what the sides of a round do before it: with flush, both
// empty their neighbour tables, so that ARP is asked again; cli is a
// command the writer runs then (roundScript).
type roundPrep struct {
	flush bool
	cli   string
}

// roundScript is one side's part of a round, a shell script whose output
// parts each follow a line "@@@ NAME" (sections): with flush, its
// neighbour tables emptied ("flush", FAILED in it if one could not be);
// prep, if any, run ("prep", FAILED in it if it failed); its rails'
// counters "before" the runs, which start at once (inParallel), and
// "after" them; then its "neighbours" table and each rail's netdev's MAC
// ("macs").
func (ws railWorkers) roundScript(flush bool, prep string, argvs [][]string, secs int) string {
	var b strings.Builder
	if flush {
		b.WriteString("echo '@@@ flush'\n")
		for k := range ws.rails {
			fmt.Fprintf(&b, "busybox ip neigh flush dev %s 2>&1 || echo FAILED\n", ifname(k))
		}
	}
	if prep != "" {
		fmt.Fprintf(&b, "echo '@@@ prep'; { %s; } 2>&1 || echo FAILED\n", prep)
	}
	counters := "cat " + strings.Join(ws.counterFiles(), " ")
	fmt.Fprintf(&b, "echo '@@@ before'; %s\n", counters)
	b.WriteString(inParallel(argvs, secs))
	fmt.Fprintf(&b, "echo '@@@ after'; %s\n", counters)
	b.WriteString("echo '@@@ neighbours'; busybox ip neigh show\n")
	var macs []string
	for k := range ws.rails {
		macs = append(macs, "/sys/class/net/"+ifname(k)+"/address")
	}
	fmt.Fprintf(&b, "echo '@@@ macs'; cat %s\n", strings.Join(macs, " "))
	return b.String()
}

// inParallel is a shell script that runs every argv at once, each under
// busybox's timeout (secs), and then prints each one's output and exit
// status (a line "@@status N") after a line "@@@ run K". The outputs wait
// in /dev/shm, which every container has writable (the tools image has no
// /tmp).
func inParallel(argvs [][]string, secs int) string {
	var b strings.Builder
	for k, argv := range argvs {
		fmt.Fprintf(&b, "( busybox timeout %d %s; echo \"@@status $?\" ) > /dev/shm/rails-run-%d 2>&1 &\n", secs, strings.Join(argv, " "), k)
	}
	b.WriteString("wait\n")
	for k := range argvs {
		fmt.Fprintf(&b, "echo '@@@ run %d'; cat /dev/shm/rails-run-%d\n", k, k)
	}
	return b.String()
}

// withStderr is an exec's stdout with its stderr as a last section,
// "stderr": stderr comes apart from stdout, and in stdout's last part it
// would read as that part's.
func withStderr(stdout, stderr string) string {
	return stdout + "\n@@@ stderr\n" + stderr
}

// sections splits a script's output into the parts after each line
// "@@@ NAME", by name.
func sections(out string) map[string]string {
	m := map[string]string{}
	for _, part := range strings.Split(out, "@@@ ")[1:] {
		name, rest, _ := strings.Cut(part, "\n")
		m[strings.TrimSpace(name)] = rest
	}
	return m
}

// allCompleted reports whether every run of inParallel's output exited 0.
func allCompleted(runs []string) bool {
	for _, out := range runs {
		if !strings.Contains(out, "@@status 0") {
			return false
		}
	}
	return true
}

// perRun is each of n runs' output of inParallel, from its sections.
func perRun(out map[string]string, n int) []string {
	runs := make([]string, n)
	for k := range runs {
		runs[k] = out["run "+strconv.Itoa(k)]
	}
	return runs
}

// parseRun reads one rail's ib_write_bw client and server output.
func parseRun(cli, srv string) (rig.WriteBW, error) {
	if !allCompleted([]string{cli, srv}) {
		return rig.WriteBW{Output: cli}, fmt.Errorf("ib_write_bw did not complete: client:\n%s\nserver:\n%s", cli, srv)
	}
	bw, err := rig.ParseWriteBW(cli)
	if err == nil && bw.Iters != railIters {
		err = fmt.Errorf("ib_write_bw: %d iterations, want %d:\n%s", bw.Iters, railIters, cli)
	}
	return bw, err
}

// waitListening waits, at most limit, until a process listens on every
// one of ports in w's pod, as its /proc/net/tcp shows.
func waitListening(c context.Context, w spanWorker, ports []int, limit time.Duration) error {
	var last string
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(time.Second) {
		tcp, _, err := execCtx(c, workersNS, w.name, "worker", "cat", "/proc/net/tcp", "/proc/net/tcp6")
		if err != nil {
			last = err.Error()
			continue
		}
		var missing []string
		for _, p := range ports {
			if !rig.Listening(tcp, p) {
				missing = append(missing, strconv.Itoa(p))
			}
		}
		if len(missing) == 0 {
			return nil
		}
		last = "not listening on " + strings.Join(missing, ", ")
	}
	return fmt.Errorf("%s: %s after %s", w.name, last, limit)
}

// describe is a rail's run in one line.
func (run railRun) describe(r rail, k int, srv, cli spanWorker) string {
	res := fmt.Sprintf("%.2f MB/s", run.bw.AverageMBps)
	switch {
	case run.Idle:
		res = "idle"
	case run.Err != nil:
		res = "FAILED: " + firstLine(run.Err.Error())
	}
	return fmt.Sprintf("%s (%s, node's %s), node %d -> node %d: %s; a stream %d packets: writer's device sent %d (netdev tx %d), reader's device received %d (netdev rx %d)",
		r.name, ifname(k), r.nic, cli.node, srv.node, res, run.Want, run.Sent.RDMASent, run.Sent.NetTx, run.Rcvd.RDMARcvd, run.Rcvd.NetRx)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// kept fails t unless every stream of a round kept to its rail's NICs
// (railcount.Verdict: exact RoCE counts on the stream's rail at both
// ends, the netdevs within railcount.NetdevAllowance, nothing on the
// other rails), logging every rail's run.
func (ws railWorkers) kept(t *testing.T, runs []railRun, srv, cli spanWorker) {
	t.Helper()
	for k, run := range runs {
		t.Logf("rail %s", run.describe(ws.rails[k], k, srv, cli))
	}
	for _, f := range ws.verdict(runs, srv, cli) {
		t.Errorf("%s: the streams did not keep to their rails' NICs", f.Msg)
	}
}

// verdict is railcount.Verdict of a round from cli into srv.
func (ws railWorkers) verdict(runs []railRun, srv, cli spanWorker) []railcount.Fault {
	streams := make([]railcount.Stream, len(runs))
	for k, run := range runs {
		streams[k] = run.Stream
	}
	return railcount.Verdict(ws.inPods(), streams, cli.label(), srv.label())
}

// label is the worker in a verdict's words: its node and name.
func (w spanWorker) label() string { return fmt.Sprintf("node %d's %s", w.node, w.name) }

// arpOf reads net.ipv4.conf.<netdev>.arp_ignore and arp_announce of
// each of netdevs in w's pod, in one exec: "ignore/announce" each, spaced.
func (ws railWorkers) arpOf(t *testing.T, w spanWorker, netdevs ...string) string {
	t.Helper()
	var files []string
	for _, nd := range netdevs {
		d := "/proc/sys/net/ipv4/conf/" + nd + "/"
		files = append(files, d+"arp_ignore", d+"arp_announce")
	}
	out, stderr, err := execIn(t, workersNS, w.name, "worker", append([]string{"cat"}, files...)...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", w.name, err, stderr)
	}
	f := strings.Fields(out)
	var pairs []string
	for i := 0; i+1 < len(f); i += 2 {
		pairs = append(pairs, f[i]+"/"+f[i+1])
	}
	return strings.Join(pairs, " ")
}

// crossedNeighbours lists the entries of the writer's neighbour table
// after round rd that hold one of srv's rail addresses at the MAC of
// another of srv's rails: ARP flux, what sends a rail's RoCE packets to
// another rail's NIC.
func (ws railWorkers) crossedNeighbours(rd railRound, srv, cli spanWorker) []string {
	if len(rd.srvMACs) != len(ws.rails) {
		return []string{fmt.Sprintf("%s's rails' MACs unread (%q)", srv.name, rd.srvMACs)}
	}
	macs := map[string]string{} // srv's rail address -> its netdev's MAC
	owner := map[string]string{}
	for k, r := range ws.rails {
		macs[r.ip(srv.node)] = rd.srvMACs[k]
		owner[rd.srvMACs[k]] = ifname(k)
	}
	var crossed []string
	for _, l := range strings.Split(rd.cliNeighbours, "\n") {
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

// railFindings runs `rdma-netns doctor --pid` on w's pod on its node
// (doctorOn) and returns its findings of the rails checks.
func (ws railWorkers) railFindings(t *testing.T, w spanWorker) []doctor.Finding {
	t.Helper()
	var out []doctor.Finding
	for _, f := range doctorOn(t, w).Findings {
		if strings.HasPrefix(f.Check, "rail") {
			out = append(out, f)
		}
	}
	return out
}

// pastedName finds the names in the command of a rail fix: the netns
// path, the netdev after "dev", and the netdev in a sysctl key.
var pastedName = regexp.MustCompile(`--net=(\S+)|\bdev (\S+)|conf[./]([^./\s]+)[./]`)

// unquotedNames are the names of the command a rail fix gives to paste
// (after "try it on this pod: ") that a shell would read outside single
// quotes, and so run as shell if a pod chose them so; "no command" if the
// fix has none.
func unquotedNames(fix string) []string {
	_, cmd, ok := strings.Cut(fix, "try it on this pod: ")
	if !ok {
		return []string{"no command"}
	}
	// quoted[i]: the shell reads byte i inside single quotes.
	quoted := make([]bool, len(cmd))
	in := false
	for i := 0; i < len(cmd); i++ {
		switch {
		case cmd[i] == '\\' && !in:
			i++
		case cmd[i] == '\'':
			in = !in
			continue
		}
		if i < len(cmd) {
			quoted[i] = in
		}
	}
	var bare []string
	for _, m := range pastedName.FindAllStringSubmatchIndex(cmd, -1) {
		for g := 2; g < len(m); g += 2 {
			start, end := m[g], m[g+1]
			if start < 0 {
				continue
			}
			if cmd[start] == '\'' {
				start++
			}
			if start < end && !quoted[start] {
				bare = append(bare, cmd[m[g]:end])
			}
		}
	}
	return bare
}

// railsClean fails t unless the doctor, on each worker's pod, makes the
// rails findings a job whose rails keep apart must get, each OK: rail-gid
// and rail-arp for every rail, one rails finding naming every rail's
// netdev; and no rails finding that is not OK. A doctor that found no
// rails, or read another pod, fails it.
func (ws railWorkers) railsClean(t *testing.T) {
	t.Helper()
	var netdevs, want []string
	for k, r := range ws.rails {
		netdevs = append(netdevs, ifname(k))
		subj := fmt.Sprintf("%s (%s)", r.name, ifname(k))
		want = append(want, "rail-gid "+subj, "rail-arp "+subj)
	}
	want = append(want, "rails "+strings.Join(netdevs, " "))
	for _, w := range ws.pods {
		ok := map[string]bool{}
		for _, f := range ws.railFindings(t, w) {
			if f.Severity != doctor.OK {
				t.Errorf("doctor on %s's rails kept apart: %s %s %s: %s", w.label(), f.Severity, f.Check, f.Subject, f.Reason)
				continue
			}
			subj := f.Subject
			if f.Check == "rails" { // the netdevs, in the doctor's order
				nds := strings.Fields(subj)
				sort.Strings(nds)
				subj = strings.Join(nds, " ")
			}
			ok[f.Check+" "+subj] = true
		}
		for _, c := range want {
			if !ok[c] {
				t.Errorf("doctor on %s: no OK %s, which every rail of a job kept apart gets", w.label(), c)
			}
		}
	}
}

// railGroups are, for each direction of the job's perftest, the rails
// whose streams run at once in a round, as indices into the job's four
// (r0 r1 rail-optimized, s0 s1 on the shared segment: jobRails's, or
// claimRails's rdma_r2 and rdma_r3 on subnets of their own): all four node 2
// into node 1 (every stream on its own rail however busy the others);
// then, each way, r0 and s0 with r1 and s1 quiet, and r1 and s1 with r0
// and s0 quiet. So each shared rail is quiet while its neighbour on the
// segment streams, in both directions: a stream crossing to the
// neighbour's NIC, the one crossing the segment allows, lands on a quiet
// rail (and, when the neighbour streams too, beyond its exact count).
var railGroups = [2][][]int{{{0, 1, 2, 3}, {0, 2}, {1, 3}}, {{0, 2}, {1, 3}}}

// groups are the rounds' rails of direction dir (0 or 1): railGroups with
// the rails' layout, the one rail otherwise.
func (ws railWorkers) groups(dir int) [][]int {
	if len(ws.rails) == 1 {
		return [][]int{{0}}
	}
	return railGroups[dir]
}

// ucx is UCX over every rail of the workers (ucxOver).
func (ws railWorkers) ucx() []string { return ucxOver(ws.devNames()...) }

// devNames are the rails' RDMA devices as the workers see them, in order.
func (ws railWorkers) devNames() []string {
	devs := make([]string, len(ws.rails))
	for k, r := range ws.rails {
		devs[k] = r.name
	}
	return devs
}

// railsAtARPDefaults is TestTwoNodes's last part on the rails' layout:
// the shared rails without the NAD's chain (overlays/nad-rails-shared-bare),
// at the kernel's ARP defaults, in both pods. Over rounds with the
// neighbour tables flushed between them, what happens is logged (it is a
// race between two ARP answers: a crossed neighbour entry, resends, a
// stream that stalls); then a round with a stream sent astray on purpose
// (astrayControl) must be named so; the doctor must name the rails' ARP
// settings in both pods. Deleted, every rail's device and NIC are home on
// both nodes.
func railsAtARPDefaults(t *testing.T) {
	if !railsLayout() {
		t.Skipf("the pair booted with %d rails of their own and ARP defaults %v: the rails need --rails %d --arp-defaults and %d NICs (the Makefile's K8S_PAIR_OPTS and K8S_PAIR_NICS)",
			node.Rails, node.ARPDefaults, len(optimizedRails), 1+len(optimizedRails)+len(sharedRails))
	}
	applyManifest(t, "nad-rails-shared-bare")
	// UCX given both rails at its default rail counts, as a job that
	// lists its rails and nothing more: the doctor must warn (rail-ucx).
	var devs []string
	for _, r := range sharedRails {
		devs = append(devs, r.name)
	}
	ws := startRailWorkers(t, "bare", withDevs(t, sharedRails),
		corev1.EnvVar{Name: "UCX_NET_DEVICES", Value: ucxPorts(devs)}, corev1.EnvVar{Name: "UCX_TLS", Value: "ud_verbs,self"})
	for _, w := range ws.pods {
		if got := ws.arpOf(t, w, "all", ifname(0), ifname(1)); got != "0/0 0/0 0/0" {
			t.Fatalf("%s: arp_ignore/arp_announce (all, net1, net2) %s, want the kernel's 0/0 0/0 0/0: the pair must boot with --arp-defaults (K8S_PAIR_OPTS)", w.label(), got)
		}
	}
	const rounds = 3
	both := []int{0, 1}
	kept := 0
	macs := map[string][]string{} // each pod's rails' MACs, as its rounds as reader read them
	for n := range rounds {
		srv, cli := ws.pods[n%2], ws.pods[1-n%2]
		// 20 s: a stream on its own rail takes 2-10 s here; one whose
		// packets reach the other rail's NIC never completes. Both
		// neighbour tables flushed first: every round asks ARP again.
		rd := ws.round(t, n, both, srv, cli, 20*time.Second, roundPrep{flush: true})
		macs[srv.name] = rd.srvMACs
		for k, run := range rd.runs {
			t.Logf("at the kernel's ARP defaults, round %d: rail %s", n+1, run.describe(ws.rails[k], k, srv, cli))
		}
		if crossed := ws.crossedNeighbours(rd, srv, cli); len(crossed) > 0 {
			t.Logf("round %d: ARP flux: %s", n+1, strings.Join(crossed, "; "))
		}
		faults := ws.verdict(rd.runs, srv, cli)
		for _, f := range faults {
			t.Logf("round %d: %s", n+1, f.Msg)
		}
		if len(faults) == 0 {
			kept++
		}
	}
	t.Logf("at the kernel's ARP defaults, without tuning and sbr: %d of %d rounds kept every stream on its rail", kept, rounds)
	ws.astrayControl(t, rounds, macs[ws.pods[1].name])
	for _, w := range ws.pods {
		var arp []string
		var ucx bool
		for _, f := range ws.railFindings(t, w) {
			if f.Check == "rail-arp" && f.Severity == doctor.Fail {
				arp = append(arp, f.Subject)
			}
			ucx = ucx || f.Check == "rail-ucx" && f.Severity == doctor.Warn
			if f.Check == "rail-arp" || f.Check == "rail-route" {
				// The pod names its netdevs: a fix to paste quotes them.
				if bare := unquotedNames(f.Remedy); len(bare) > 0 {
					t.Errorf("doctor's %s fix for %s on %s leaves %q outside single quotes: %s", f.Check, f.Subject, w.label(), bare, f.Remedy)
				}
			}
		}
		if want := fmt.Sprintf("%s (%s) %s (%s)", ws.rails[0].name, ifname(0), ws.rails[1].name, ifname(1)); strings.Join(arp, " ") != want {
			t.Errorf("doctor on %s, rails sharing a subnet at arp_ignore 0: rail-arp FAIL for %v, want both rails (%s)", w.label(), arp, want)
		}
		if !ucx {
			t.Errorf("doctor on %s, whose env gives UCX two rails at its default rail counts: no rail-ucx WARN", w.label())
		}
	}
	ws.stop(t)
}

// astrayControl shows that the rails' verdict (kept) names a stream whose
// packets reach another rail's NIC: in the writer, node 1's pod, the
// reader's first rail address is pinned to the MAC of the reader's second
// rail's netdev (srvMACs, the reader's rails' MACs), as ARP flux leaves a
// neighbour entry, with busybox arp -s (a permanent entry: what `ip neigh
// replace ADDR lladdr MAC nud permanent` makes; the tools image has
// busybox's ip, which has no neigh replace). The first rail then streams
// alone, 12 s at most (a stream astray never completes; rxe resends its
// window every ~4 s at -u 20), the second quiet, and the verdict must call
// the first rail's stream astray to the reader's second netdev. n is the
// round's number (its ports).
func (ws railWorkers) astrayControl(t *testing.T, n int, srvMACs []string) {
	t.Helper()
	cli, srv := ws.pods[0], ws.pods[1]
	if len(srvMACs) != len(ws.rails) {
		t.Fatalf("astray control: %s's rails' MACs unread (%q)", srv.label(), srvMACs)
	}
	pin := fmt.Sprintf("busybox arp -i %s -s %s %s", ifname(0), ws.rails[0].ip(srv.node), srvMACs[1])
	rd := ws.round(t, n, []int{0}, srv, cli, 12*time.Second, roundPrep{cli: pin})
	for k, run := range rd.runs {
		t.Logf("astray control (%s in %s): rail %s", pin, cli.name, run.describe(ws.rails[k], k, srv, cli))
	}
	t.Logf("astray control: %s's neighbours: %s", cli.name, strings.Join(ws.crossedNeighbours(rd, srv, cli), "; "))
	var msgs []string
	for _, f := range ws.verdict(rd.runs, srv, cli) {
		if f.Rail == 0 && f.Astray(1) {
			t.Logf("astray control, as it must be: %s", f.Msg)
			return
		}
		msgs = append(msgs, f.Msg)
	}
	t.Errorf("astray control: %s's %s address pinned to %s's MAC in %s, the per-rail check did not report %s's stream astray to %s's %s; it said: %q",
		srv.label(), ws.rails[0].name, ifname(1), cli.name, ws.rails[0].name, srv.label(), ifname(1), msgs)
}

// railBenchRounds is how many rounds of each kind TestBenchRails runs
// (make bench-nodes); 0 skips it, as make e2e-k8s-nodes does.
var railBenchRounds = flag.Int("k8s.bench-rails", 0, "TestBenchRails: rounds of ib_write_bw on one rail and on two rails at once, alternated (0: skip)")

// requireRailBench skips a rails benchmark unless its rounds are set (by
// the flag named) and the boot is make bench-nodes's two nodes with the
// rails' layout.
func requireRailBench(t *testing.T, rounds int, flagName string) {
	t.Helper()
	if rounds == 0 {
		t.Skip("a benchmark: make bench-nodes runs it (-" + flagName + " N)")
	}
	if *nodes < 2 || !railsLayout() {
		t.Skip("make bench-nodes's two-node boot with the rails' layout runs this")
	}
}

// TestBenchRails prints the aggregate ib_write_bw of two rail-optimized
// rails at once against one rail alone, between one pod per node holding
// both rails (overlays/nad-rails), rounds of each alternated with the
// order alternating, so that the machine's load falls on both alike. On
// the emulated pair both rails' packets share the same two cores, so the
// ratio says what the emulation lets through, not what two NICs would:
// figures only; every stream must still keep to its rail (kept).
func TestBenchRails(t *testing.T) {
	requireRailBench(t, *railBenchRounds, "k8s.bench-rails")
	waitJoined(t, 2, "")
	applyManifest(t, "nad-rails")
	ws := startRailWorkers(t, "bench-rails", withDevs(t, optimizedRails))
	srv, cli := ws.pods[0], ws.pods[1]
	kinds := []struct {
		label string
		group []int
	}{{"one rail (rdma_r0)", []int{0}}, {"two rails at once (rdma_r0, rdma_r1)", []int{0, 1}}}
	agg := make([][]float64, len(kinds))
	n := 0
	for i := range *railBenchRounds {
		for j := range kinds {
			if i%2 == 1 {
				j = len(kinds) - 1 - j
			}
			runs := ws.round(t, n, kinds[j].group, srv, cli, 2*time.Minute, roundPrep{}).runs
			n++
			ws.kept(t, runs, srv, cli)
			var mbps float64
			for _, k := range kinds[j].group {
				mbps += runs[k].bw.AverageMBps
			}
			agg[j] = append(agg[j], mbps)
			t.Logf("round %d, %s: %.2f MB/s", i+1, kinds[j].label, mbps)
		}
	}
	ws.stop(t)
	var b strings.Builder
	fmt.Fprintf(&b, "ib_write_bw node 2 -> node 1, %d x %d B per rail, %d rounds of each, alternated (TCG-emulated nodes: noisy, the ratio is the figure)\n", railIters, railSize, *railBenchRounds)
	for j, k := range kinds {
		st := statsOf(agg[j])
		fmt.Fprintf(&b, "%-40s aggregate p50 %8.2f MB/s (min %.2f, max %.2f)\n", k.label, st.p50, st.min, st.max)
	}
	fmt.Fprintf(&b, "two rails / one rail: %.2f\n", statsOf(agg[1]).p50/statsOf(agg[0]).p50)
	fmt.Printf("=== K8S RAILS BENCH BEGIN ===\n%s=== K8S RAILS BENCH END ===\n", b.String())
}
