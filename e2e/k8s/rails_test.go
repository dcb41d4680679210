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
// job holds all four rails (jobRails); railsAtARPDefaults then shows what
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
// be home on each node.
func (ws railWorkers) stop(t *testing.T) {
	t.Helper()
	deletePods(t, workersNS, workersGrace, ws.pods[0].name, ws.pods[1].name)
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

// counterFiles are the files of every rail's counters in a pod, four
// per rail in railCounters' order.
func (ws railWorkers) counterFiles() []string {
	var files []string
	for k, r := range ws.rails {
		hw := "/sys/class/infiniband/" + r.name + "/ports/1/hw_counters/"
		st := "/sys/class/net/" + ifname(k) + "/statistics/"
		files = append(files, hw+"sent_pkts", hw+"rcvd_pkts", st+"tx_packets", st+"rx_packets")
	}
	return files
}

// parseCounters reads counterFiles' contents, as cat prints them.
func (ws railWorkers) parseCounters(out string) ([]railCounters, error) {
	f := strings.Fields(out)
	if len(f) != 4*len(ws.rails) {
		return nil, fmt.Errorf("%d counters, want %d: %q", len(f), 4*len(ws.rails), out)
	}
	n := make([]int64, len(f))
	for i, s := range f {
		var err error
		if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, fmt.Errorf("counter %d: %q", i, s)
		}
	}
	var cs []railCounters
	for k := range ws.rails {
		cs = append(cs, railCounters{n[4*k], n[4*k+1], n[4*k+2], n[4*k+3]})
	}
	return cs, nil
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
			d[w] = append(d[w], c.minus(before[w][k]))
		}
	}
	return d
}

// railRun is one rail's stream of a round: what ib_write_bw said and the
// packets each end counted.
type railRun struct {
	idle       bool // no stream of the round on this rail
	bw         rig.WriteBW
	err        error
	want       int64 // a stream's RoCE packets: bytes / RoCE MTU
	sent, rcvd railCounters
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
// With flush, both sides empty their neighbour tables first, so that ARP
// is asked again. Each side's part is one exec (roundScript), the servers
// checked listening by one exec at a time: an exec costs seconds of the
// emulated node's CPU, and one per run, poll or counter read starved the
// runs and slowed the stage.
func (ws railWorkers) round(t *testing.T, n int, group []int, srv, cli spanWorker, limit time.Duration, flush bool) railRound {
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
		o, e, _ := execCtx(c, workersNS, srv.name, "worker", "sh", "-c", ws.roundScript(flush, srvRuns, secs+15))
		srvDone <- withStderr(o, e)
	}()
	if err := waitListening(c, srv, ports, 90*time.Second); err != nil {
		execCtx(c, workersNS, srv.name, "worker", "busybox", "killall", "ib_write_bw")
		t.Fatalf("ib_write_bw servers: %v\n%s", err, <-srvDone)
	}
	o, e, err := execCtx(c, workersNS, cli.name, "worker", "sh", "-c", ws.roundScript(flush, cliRuns, secs))
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
		runs[k].idle = true
	}
	cliRunOut, srvRunOut := perRun(cliOut, len(group)), perRun(srvOut, len(group))
	mtu := 1024
	for i, k := range group {
		runs[k].idle = false
		runs[k].bw, runs[k].err = parseRun(cliRunOut[i], srvRunOut[i])
		if err != nil && runs[k].err == nil {
			runs[k].err = err
		}
		if m := mtuLine.FindStringSubmatch(runs[k].bw.Output); m != nil {
			mtu, _ = strconv.Atoi(m[1])
		}
	}
	for k := range ws.rails {
		runs[k].want = int64(railSize * railIters / mtu)
		runs[k].sent, runs[k].rcvd = cliAfter[k].minus(cliBefore[k]), srvAfter[k].minus(srvBefore[k])
	}
	return railRound{runs: runs, cliNeighbours: cliOut["neighbours"], srvMACs: strings.Fields(srvOut["macs"])}
}

// roundScript is one side's part of a round, a shell script whose output
// parts each follow a line "@@@ NAME" (sections): with flush, its
// neighbour tables emptied ("flush", FAILED in it if one could not be);
// its rails' counters "before" the runs, which start at once
// (inParallel), and "after" them; then its "neighbours" table and each
// rail's netdev's MAC ("macs").
func (ws railWorkers) roundScript(flush bool, argvs [][]string, secs int) string {
	var b strings.Builder
	if flush {
		b.WriteString("echo '@@@ flush'\n")
		for k := range ws.rails {
			fmt.Fprintf(&b, "busybox ip neigh flush dev %s 2>&1 || echo FAILED\n", ifname(k))
		}
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
func (run railRun) describe(r rail, srv, cli spanWorker) string {
	res := fmt.Sprintf("%.2f MB/s", run.bw.AverageMBps)
	switch {
	case run.idle:
		res = "idle"
	case run.err != nil:
		res = "FAILED: " + firstLine(run.err.Error())
	}
	return fmt.Sprintf("%s (%s), node %d -> node %d: %s; a stream %d packets: writer's device sent %d (netdev tx %d), reader's device received %d (netdev rx %d)",
		r.name, r.nic, cli.node, srv.node, res, run.want, run.sent.rdmaSent, run.sent.netTx, run.rcvd.rdmaRcvd, run.rcvd.netRx)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// kept fails t unless every stream of a round entered and left by its
// rail's NIC: it completed, the writer's device and netdev sent and the
// reader's received at least the stream's packets and at most 15 % more
// (rxe resends what went astray: a stream whose packets reached another
// rail's NIC shows as resends on its own rail), and the rails without a
// stream carried less than a tenth of one (packets astray show there).
func (ws railWorkers) kept(t *testing.T, runs []railRun, srv, cli spanWorker) {
	t.Helper()
	for k, run := range runs {
		r := ws.rails[k]
		t.Logf("rail %s", run.describe(r, srv, cli))
		if run.err != nil {
			t.Errorf("rail %s, node %d -> node %d: %v", r.name, cli.node, srv.node, run.err)
			continue
		}
		lo, hi, want := run.want, run.want+run.want*15/100, fmt.Sprintf("its stream's %d, +15 %% for resends", run.want)
		if run.idle {
			lo, hi, want = 0, run.want/10-1, fmt.Sprintf("no stream of its own: under a tenth of another's %d", run.want)
		}
		for _, c := range []struct {
			what string
			n    int64
		}{
			{fmt.Sprintf("node %d's %s sent", cli.node, r.name), run.sent.rdmaSent},
			{fmt.Sprintf("node %d's %s transmitted", cli.node, ifname(k)), run.sent.netTx},
			{fmt.Sprintf("node %d's %s received", srv.node, r.name), run.rcvd.rdmaRcvd},
			{fmt.Sprintf("node %d's %s received", srv.node, ifname(k)), run.rcvd.netRx},
		} {
			if c.n < lo || c.n > hi {
				t.Errorf("rail %s: %s %d packets, want %d to %d (%s): the streams did not keep to their rails' NICs",
					r.name, c.what, c.n, lo, hi, want)
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

// railGroups are, for each direction of the job's perftest, the rails
// whose streams run at once in a round, as indices into jobRails' four:
// all four (every stream on its own rail however busy the others), then
// one layout's two with the other layout's quiet (a stream astray would
// show on a quiet rail): the rail-optimized pair one way, the shared pair
// the other, so that each rail is quiet in one round.
var railGroups = [2][][]int{{{0, 1, 2, 3}, {0, 1}}, {{0, 1, 2, 3}, {2, 3}}}

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
// at the kernel's ARP defaults. Over rounds with the neighbour tables
// flushed between them, what happens is logged (it is a race between two
// ARP answers: a crossed neighbour entry, resends, a stream that stalls),
// and the doctor must name the rails' ARP settings. Deleted, every rail's
// device and NIC are home on both nodes.
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
	if got := ws.arpOf(t, ws.pods[0], "all") + " " + ws.arpOf(t, ws.pods[0], ifname(0)); got != "0/0 0/0" {
		t.Fatalf("%s: arp_ignore/arp_announce (all, net1) %s, want the kernel's 0/0 0/0: the pair must boot with --arp-defaults (K8S_PAIR_OPTS)", ws.pods[0].name, got)
	}
	const rounds = 3
	both := []int{0, 1}
	kept := 0
	for n := range rounds {
		srv, cli := ws.pods[n%2], ws.pods[1-n%2]
		// 20 s: a stream on its own rail takes 2-10 s here; one whose
		// packets reach the other rail's NIC never completes. Both
		// neighbour tables flushed first: every round asks ARP again.
		rd := ws.round(t, n, both, srv, cli, 20*time.Second, true)
		ok := true
		for k, run := range rd.runs {
			t.Logf("at the kernel's ARP defaults, round %d: rail %s", n+1, run.describe(ws.rails[k], srv, cli))
			hi := run.want + run.want*15/100
			ok = ok && run.err == nil && run.sent.rdmaSent <= hi && run.rcvd.rdmaRcvd >= run.want && run.rcvd.rdmaRcvd <= hi
		}
		if crossed := ws.crossedNeighbours(rd, srv, cli); len(crossed) > 0 {
			t.Logf("round %d: ARP flux: %s", n+1, strings.Join(crossed, "; "))
		}
		if ok {
			kept++
		}
	}
	t.Logf("at the kernel's ARP defaults, without tuning and sbr: %d of %d rounds kept every stream on its rail", kept, rounds)
	var named, ucx bool
	for _, f := range ws.railFindings(t) {
		named = named || f.Check == "rail-arp" && f.Severity == doctor.Fail
		ucx = ucx || f.Check == "rail-ucx" && f.Severity == doctor.Warn
	}
	if !named {
		t.Errorf("doctor on rails sharing a subnet at arp_ignore 0: no rail-arp FAIL")
	}
	if !ucx {
		t.Errorf("doctor on a pod whose env gives UCX two rails at its default rail counts: no rail-ucx WARN")
	}
	ws.stop(t)
}

// railBenchRounds is how many rounds of each kind TestBenchRails runs
// (make bench-nodes); 0 skips it, as make e2e-k8s-nodes does.
var railBenchRounds = flag.Int("k8s.bench-rails", 0, "TestBenchRails: rounds of ib_write_bw on one rail and on two rails at once, alternated (0: skip)")

// TestBenchRails prints the aggregate ib_write_bw of two rail-optimized
// rails at once against one rail alone, between one pod per node holding
// both rails (overlays/nad-rails), rounds of each alternated with the
// order alternating, so that the machine's load falls on both alike. On
// the emulated pair both rails' packets share the same two cores, so the
// ratio says what the emulation lets through, not what two NICs would:
// figures only; every stream must still keep to its rail (kept).
func TestBenchRails(t *testing.T) {
	if *railBenchRounds == 0 {
		t.Skip("a benchmark: make bench-nodes runs it (-k8s.bench-rails N)")
	}
	if *nodes < 2 || !railsLayout() {
		t.Skip("make bench-nodes's two-node boot with the rails' layout runs this")
	}
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
			runs := ws.round(t, n, kinds[j].group, srv, cli, 2*time.Minute, false).runs
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
