//go:build e2e

package k8s

// The two-node cluster (make e2e-k8s's two-node boot, scripts/vm-pair.sh):
// node 1 runs the tests, node 2 (-k8s.boot join) is a node of the same
// cluster whose rxe NICs share an Ethernet link with node 1's. What the
// tests need of node 2 beyond the API (which devices and NICs its own
// netns holds, a reboot) they ask its agent, over a management address on
// eth0, as an operator would ssh to the node.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/doctorrun"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/cluster"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
	"github.com/rdma-netns/rdma-netns/pkg/doctor"
	"github.com/rdma-netns/rdma-netns/pkg/drarecord"
)

var nodes = flag.Int("k8s.nodes", 1, "how many nodes the cluster has: 2 in make e2e-k8s's two-node boot, where node 1 runs the tests and node 2 boots with -k8s.boot join")

// requireRails makes the rails' layout a precondition of the run: the
// Makefile sets it for node 1 under CI=true and whenever K8S_PAIR_OPTS
// asks for --rails, so that a layout lost on the way to the guest fails
// the stage instead of running the job on one rail and skipping the rails'
// checks and benches.
var requireRails = flag.Bool("k8s.rails-required", false, "fail at once unless this VM booted with the rails' layout (vm-run.sh --rails 2 --arp-defaults, 5 NICs), rather than run the two-node job on one rail and skip the rails' checks")

const (
	// mgmtNIC carries the nodes' management addresses, mgmtIP(n); the
	// pods' RDMA NIC is twoNodeNIC.
	mgmtNIC   = "eth0"
	mgmtPort  = 7070
	mgmtOwner = "the two-node rig's agent"
	// exitReboot is node 2's exit status when asked to reboot: vm-pair.sh
	// --again (Makefile) boots it again on its disk.
	exitReboot = 75
	// twoNodeNIC is the NIC the NAD names (overlays/nad-renamed) and
	// twoNodeDev its RDMA device on every node VM (vm-run.sh's layout), which
	// the pods see renamed to twoNodeName.
	twoNodeNIC     = "eth1"
	twoNodeDev     = "rxe1"
	twoNodeName    = "rdma_net1"
	twoNodeNetwork = "rdma-net-renamed"
)

// mgmtIP is node n's management address.
func mgmtIP(n int) string { return fmt.Sprintf("10.99.0.%d", n) }

// setupMgmt puts this node's management address on mgmtNIC (up since
// /init), which shares the link with the other nodes' NICs.
func setupMgmt() error {
	l, err := netlink.LinkByName(mgmtNIC)
	if err != nil {
		return err
	}
	a, err := netlink.ParseAddr(mgmtIP(node.Number) + "/24")
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(l, a); err != nil {
		return fmt.Errorf("address %s on %s: %v", a, mgmtNIC, err)
	}
	return nil
}

// prepareJoin imports what the first node's tests schedule on this node
// (the DaemonSets' images and the MPI job's; the tools image came with
// containerd) and writes the pods' cluster network, as node 1's install
// and setupMultus do for it.
func prepareJoin() error {
	for _, img := range []string{"rdma-netns-image.tar", "multus-image.tar", mpiImageTar} {
		if err := node.ImportImage(node.ManifestDir + "/" + img); err != nil {
			return err
		}
	}
	return node.InstallClusterNetwork()
}

// nodeNetns is what a node's own netns holds, as its agent reports it,
// and the layout its VM booted with.
type nodeNetns struct {
	Node        string   `json:"node"`
	BootID      string   `json:"bootID"` // the kernel's, new on every boot
	RDMA        []string `json:"rdma"`
	Links       []string `json:"links"`
	Multus      bool     `json:"multus"`      // Multus's daemon wrote its conf here
	Rails       int      `json:"rails"`       // node.Rails
	ARPDefaults bool     `json:"arpDefaults"` // node.ARPDefaults
	// DRARecords are the claim records rdma-netns-dra left in
	// drarecord.DefaultDir (their claims' UIDs; a damaged one by what is
	// wrong with it): none once no pod holds a claim.
	DRARecords []string `json:"draRecords"`
	// DRADir: the record directory is there (the driver made it at its
	// first Prepare): no record in a missing directory proves nothing.
	DRADir bool `json:"draDir"`
}

func readNodeNetns() (nodeNetns, error) {
	devs, err := rig.RDMAIn("")
	if err != nil {
		return nodeNetns{}, err
	}
	links, err := rig.NetdevsIn("")
	if err != nil {
		return nodeNetns{}, err
	}
	conf, _ := os.ReadFile(node.MultusConf)
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return nodeNetns{}, err
	}
	records, err := draRecords()
	if err != nil {
		return nodeNetns{}, err
	}
	return nodeNetns{Node: node.Name, BootID: strings.TrimSpace(string(boot)), RDMA: devs, Links: links,
		Multus: strings.Contains(string(conf), `"multus-shim"`), Rails: node.Rails, ARPDefaults: node.ARPDefaults,
		DRARecords: records, DRADir: isDir(draRecordDir)}, nil
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// draRecords are this node's claim records (nodeNetns.DRARecords).
func draRecords() ([]string, error) {
	claims, bad, err := drarecord.Dir(draRecordDir).List()
	if err != nil {
		return nil, fmt.Errorf("claim records in %s: %v", draRecordDir, err)
	}
	out := bad
	for _, c := range claims {
		out = append(out, c.ClaimUID)
	}
	return out, nil
}

// runJoined serves the agent until node 1 asks this node to stop (0) or
// to reboot (exitReboot: nothing is stopped, as in `reboot -f`; vm-run.sh's
// /init syncs the disk and resets the VM, as a power cut would).
func runJoined() int {
	done := make(chan int, 1)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /host", func(w http.ResponseWriter, _ *http.Request) {
		st, err := readNodeNetns()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("GET /doctor", func(w http.ResponseWriter, r *http.Request) {
		d, err := doctorOfPod(r.Context(), r.URL.Query().Get("pod"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_ = json.NewEncoder(w).Encode(d)
	})
	for path, rc := range map[string]int{"POST /stop": 0, "POST /reboot": exitReboot} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, "ok")
			select {
			case done <- rc:
			default:
			}
		})
	}
	addr := net.JoinHostPort(mgmtIP(node.Number), strconv.Itoa(mgmtPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mgmtOwner, err)
		return 1
	}
	go func() { _ = http.Serve(ln, mux) }()
	fmt.Printf("node %s (node %d) joined; %s on %s\n", node.Name, node.Number, mgmtOwner, addr)
	rc := <-done
	// The answer goes out before the agent does.
	time.Sleep(200 * time.Millisecond)
	if rc == exitReboot {
		fmt.Printf("node %s: rebooting (kubelet, containerd and the pods are not stopped)\n", node.Name)
		os.Exit(exitReboot)
	}
	fmt.Printf("node %s: stopped by node 1\n", node.Name)
	return 0
}

// agent sends a request to node n's agent.
func agent(ctx context.Context, n int, method, path string) (*http.Response, error) {
	return agentWithin(ctx, n, method, path, 20*time.Second)
}

// agentWithin is agent with the answer awaited at most limit.
func agentWithin(ctx context.Context, n int, method, path string, limit time.Duration) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, fmt.Sprintf("http://%s:%d%s", mgmtIP(n), mgmtPort, path), nil)
	if err != nil {
		return nil, err
	}
	return (&http.Client{Timeout: limit}).Do(req)
}

// nodeHost is what node n's own netns holds.
func nodeHost(ctx context.Context, n int) (nodeNetns, error) {
	resp, err := agent(ctx, n, http.MethodGet, "/host")
	if err != nil {
		return nodeNetns{}, err
	}
	defer resp.Body.Close()
	var st nodeNetns
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("%s of node %d: %s", mgmtOwner, n, resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// podDoctor is `rdma-netns doctor --pid` on a pod's container: its report
// and what it prints for a person.
type podDoctor struct {
	Report *doctor.Report `json:"report"`
	Text   string         `json:"text"`
}

// doctorOfPod runs the doctor on this node on the first container of the
// workers' pod name, as an operator at the node would.
func doctorOfPod(c context.Context, name string) (podDoctor, error) {
	pid, err := podPid(c, workersNS, name)
	if err != nil {
		return podDoctor{}, err
	}
	bin := cririg.CNIBinDir + "/rdma-netns"
	arg := strconv.Itoa(pid)
	text, _, err := doctorrun.Text(bin, "--pid", arg)
	if err != nil {
		return podDoctor{}, err
	}
	r, _, err := doctorrun.JSON(bin, "--pid", arg)
	if err != nil {
		return podDoctor{}, err
	}
	return podDoctor{Report: r, Text: fmt.Sprintf("rdma-netns doctor --pid %s (%s on %s):\n%s", arg, name, node.Name, text)}, nil
}

// doctorOn is the doctor's report on w's pod, run on w's node (the doctor
// reads the pod's netns there): here for this node, by its agent for the
// others. Its text is logged.
func doctorOn(t *testing.T, w spanWorker) *doctor.Report {
	t.Helper()
	var d podDoctor
	var err error
	if w.node == node.Number {
		d, err = doctorOfPod(ctx(t), w.name)
	} else {
		d, err = nodeDoctor(ctx(t), w.node, w.name)
	}
	if err != nil {
		t.Fatalf("doctor on %s: %v", w.label(), err)
	}
	t.Log(d.Text)
	return d.Report
}

// nodeDoctor asks node n's agent for the doctor on the workers' pod name.
func nodeDoctor(c context.Context, n int, name string) (podDoctor, error) {
	var d podDoctor
	// Two doctor runs on the emulated node's CPU, busy with the pods.
	resp, err := agentWithin(c, n, http.MethodGet, "/doctor?pod="+url.QueryEscape(name), 2*time.Minute)
	if err != nil {
		return d, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return d, fmt.Errorf("%s of node %d: %s: %s", mgmtOwner, n, resp.Status, msg)
	}
	if err := json.NewDecoder(resp.Body).Decode(&d); err != nil || d.Report == nil {
		return d, fmt.Errorf("%s of node %d: the doctor's answer: %v", mgmtOwner, n, err)
	}
	return d, nil
}

// stopNodes tells the other nodes the tests are done.
func stopNodes() {
	for n := 2; n <= *nodes; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := agent(ctx, n, http.MethodPost, "/stop")
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "stop node %d: %v\n", n, err)
			continue
		}
		resp.Body.Close()
	}
}

// waitNodeHome waits until node n's netns holds dev and nic again: read
// here for this node, asked of its agent for the others.
func waitNodeHome(t *testing.T, n int, dev, nic string) {
	t.Helper()
	var last nodeNetns
	var lastErr error
	err := cririg.Wait(time.Minute, fmt.Sprintf("%s and %s home on node %d", dev, nic, n), func() (bool, error) {
		last, lastErr = netnsOf(ctx(t), n)
		return lastErr == nil && rig.Contains(last.RDMA, dev) && rig.Contains(last.Links, nic), nil
	})
	if err != nil {
		t.Fatalf("%v: node %d has RDMA %v, links %v (%v)", err, n, last.RDMA, last.Links, lastErr)
	}
}

// waitJoined waits for node n to be Ready with Multus's conf written, on
// a boot other than notBoot (a boot ID; "" for any).
func waitJoined(t *testing.T, n int, notBoot string) nodeNetns {
	t.Helper()
	st, err := joined(ctx(t), n, notBoot)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// joined is waitJoined returning its error.
func joined(c context.Context, n int, notBoot string) (nodeNetns, error) {
	var st nodeNetns
	name := cluster.NodeName(n)
	var last string
	err := cririg.Wait(4*time.Minute, "node "+name+" Ready with Multus", func() (bool, error) {
		nd, err := cs.CoreV1().Nodes().Get(c, name, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		ready := false
		for _, c := range nd.Status.Conditions {
			ready = ready || c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue
		}
		st, err = nodeHost(c, n)
		last = fmt.Sprintf("Ready %v, agent %+v (%v)", ready, st, err)
		return ready && err == nil && st.Multus && st.BootID != notBoot, nil
	})
	if err != nil {
		return st, fmt.Errorf("%v: %s", err, last)
	}
	return st, nil
}

// A worker of a job across nodes: one pod per node on the same NAD.
type spanWorker struct {
	name string
	node int
	ip   string // its net1 address, which it names in its network selection
}

// peerOn is w on its RDMA device dev.
func (w spanWorker) peerOn(dev string) rig.Peer {
	return rig.Peer{Run: execRunner(workersNS, w.name, "worker"), Dev: dev, IP: w.ip}
}

// spanWorkerPair is a job's two workers, one on each node.
func spanWorkerPair() []spanWorker {
	return []spanWorker{{"span-worker-0", 1, "10.99.1.1"}, {"span-worker-1", 2, "10.99.1.2"}}
}

// spanWorkerPod is a worker as a job's pod template makes it: the tools
// image, on node w.node (nodeSelector, through the scheduler), its network
// and address in the Multus annotation, no privilege and every capability
// dropped (the NRI plugin gives its container the verbs device nodes and
// memlock).
func spanWorkerPod(w spanWorker) *corev1.Pod {
	worker := unprivilegedTools("worker", "infinity")
	worker.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: w.name, Namespace: workersNS, Annotations: map[string]string{
			"k8s.v1.cni.cncf.io/networks": fmt.Sprintf(`[{"name":%q,"ips":["%s/24"]}]`, twoNodeNetwork, w.ip),
		}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(1)),
			NodeSelector:                  map[string]string{"kubernetes.io/hostname": cluster.NodeName(w.node)},
			Containers:                    []corev1.Container{worker},
		},
	}
}

// netnsOf is node n's own netns: read here for this node, asked of the
// agent for the others.
func netnsOf(c context.Context, n int) (nodeNetns, error) {
	if n == node.Number {
		return readNodeNetns()
	}
	return nodeHost(c, n)
}

// hostOf is netnsOf, failing the test when it cannot be read.
func hostOf(t *testing.T, n int) nodeNetns {
	t.Helper()
	st, err := netnsOf(ctx(t), n)
	if err != nil {
		t.Fatalf("node %d's netns: %v", n, err)
	}
	return st
}

// One job's life across two nodes, as users run it: two unprivileged MPI
// workers, one per node, each holding the job's rails (four when the pair
// booted with the rails' layout, as make test boots it, one otherwise);
// each node's devices move into its pod under the NADs' rdmaDevNames. On
// the rails' layout the job takes its NICs from ResourceClaims, rail k
// the claim's nic<k> on every node (twonode_dra_test.go); otherwise from
// overlays/nad-renamed. RDMA flows between the pods both ways on every
// rail, each rail's stream on its own NIC (perftest), an MPI allreduce
// runs over every rail (mpi_test.go), a node reboots in the middle of a
// job, and the rerun passes, on the NADs that name their NICs (jobRails:
// conf/nad-rails.yaml and nad-rails-shared-subnet.yaml stay in make test).
// Deleted, every device and NIC is home on both nodes, and no claim or
// claim record is left. One lifecycle, so that make test pays for the
// pods' starts once. Then, on the rails' layout, rails sharing a subnet
// without the NAD's ARP and routing entries, at the kernel's ARP defaults
// (rails_test.go).
func TestTwoNodes(t *testing.T) {
	if *nodes < 2 {
		t.Skip("one node: make e2e-k8s-nodes's two-node boot runs this (-k8s.nodes 2)")
	}
	claims := railsLayout()
	if claims {
		// First: the DRA driver's pods roll out while node 2 is awaited
		// and the MPI image imported.
		enableTwoNodeDRA(t)
	}
	before := waitJoined(t, 2, "")
	if before.Rails != node.Rails || before.ARPDefaults != node.ARPDefaults {
		t.Fatalf("node 2 booted with %d rails of their own and ARP defaults %v, node 1 with %d and %v: vm-pair.sh boots both alike",
			before.Rails, before.ARPDefaults, node.Rails, node.ARPDefaults)
	}
	importMPIImage(t)
	createMPISecret(t)
	var job railWorkers
	if claims {
		waitTwoNodeDRA(t)
		job = startClaimJob(t)
	} else {
		job = startJob(t)
	}
	t.Run("perftest", job.perftest)
	t.Run("allreduce", job.allreduceOverRDMA)
	rebooted := false
	t.Run("reboot", func(t *testing.T) {
		job.rebootMidJob(t, before.BootID)
		rebooted = true
	})
	if rebooted {
		// The job's pods were deleted after the reboot (and their claims
		// with them): the rerun's are new, on the same two nodes, on the
		// NADs that name their NICs.
		job = startJob(t)
		r, _ := runAllreduceWith(t, job.pods[:], "RDMA", job.ucx(), 1<<20, 5)
		t.Logf("rerun after node 2's reboot: allreduce of %d B x %d over RDMA in %.2f s", r.BytesPerRank, r.Iterations, r.Seconds)
	}
	job.stop(t)
	if claims {
		waitNoClaims(t)
		noDRARecords(t)
	}
	t.Run("rails-at-arp-defaults", railsAtARPDefaults)
}

// railsLayout reports whether the pair booted with the rails' layout
// (the Makefile's K8S_PAIR_OPTS and K8S_PAIR_NICS). Without it the job
// holds one rail, unless -k8s.rails-required stopped the run before.
func railsLayout() bool { return node.RailsLayoutMissing(len(optimizedRails), railsNICs) == "" }

// railsNICs are the NICs a node VM of the rails' layout has: eth0 (the
// management addresses), then the rails.
var railsNICs = 1 + len(optimizedRails) + len(sharedRails)

// renamedRail is overlays/nad-renamed's one rail, on eth1.
var renamedRail = rail{network: twoNodeNetwork, nic: twoNodeNIC, dev: twoNodeDev, name: twoNodeName, subnet: 1}

// jobRails are the two-node job's rails. On the rails' layout: two
// rail-optimized (overlays/nad-rails: a subnet and a link each) and two
// sharing a subnet and the segment, whose NADs chain tuning and sbr
// (overlays/nad-rails-shared); otherwise the one rail of
// overlays/nad-renamed, on eth1. On the rails' layout the job's first
// start takes its rails by claim (claimRails); its rerun after node 2's
// reboot takes these, so conf/nad-rails.yaml and
// nad-rails-shared-subnet.yaml keep running in make test.
func jobRails(t *testing.T) []rail {
	t.Helper()
	if !railsLayout() {
		applyManifest(t, "nad-renamed")
		return []rail{renamedRail}
	}
	applyManifest(t, "nad-rails")
	applyManifest(t, "nad-rails-shared")
	return withDevs(t, append(append([]rail{}, optimizedRails...), sharedRails...))
}

// startJob starts the job's two MPI workers (span-worker-0 on node 1,
// span-worker-1 on node 2) on jobRails and waits for their sshds.
func startJob(t *testing.T) railWorkers {
	t.Helper()
	job := startRailWorkersOf(t, "span-worker", jobRails(t), mpiWorkerPod)
	for _, w := range job.pods {
		waitSSHD(t, w)
	}
	return job
}

// perftest runs ib_write_bw between the workers each way on every rail,
// the rails of each of railGroups at once, every stream on its rail's NIC
// and the other rails quiet (kept), and ib_send_lat on the first rail;
// on the rails' layout, the shared rails' netdevs hold the NAD's ARP
// settings in both pods and the doctor finds every rail kept apart in
// both (railsClean).
func (job railWorkers) perftest(t *testing.T) {
	if len(job.rails) > 1 {
		var shared, want []string
		for k := len(optimizedRails); k < len(job.rails); k++ {
			shared, want = append(shared, ifname(k)), append(want, "1/2")
		}
		for _, w := range job.pods {
			if got := job.arpOf(t, w, shared...); got != strings.Join(want, " ") {
				t.Errorf("%s: arp_ignore/arp_announce of %v %s, want %s (the NAD's tuning)", w.label(), shared, got, strings.Join(want, " "))
			}
		}
	}
	n := 0
	for d, dir := range [][2]spanWorker{{job.pods[0], job.pods[1]}, {job.pods[1], job.pods[0]}} {
		srv, cli := dir[0], dir[1]
		for _, g := range job.groups(d) {
			job.kept(t, job.round(t, n, g, srv, cli, 2*time.Minute, roundPrep{}).runs, srv, cli)
			n++
		}
		lat, err := rig.SendLatBetween(ctx(t), srv.peerOn(job.rails[0].name), cli.peerOn(job.rails[0].name), 2, 500)
		if err != nil {
			t.Fatal(err)
		}
		typical := fmt.Sprintf("typical %.1f us", lat.TypicalUsec)
		if math.IsInf(lat.TypicalUsec, 0) {
			// Every round trip ran; perftest's clock calibration failed on
			// each try (two node VMs on two cores), so it timed none.
			typical = "not timed (perftest's clock calibration failed on the busy emulated CPU)"
		}
		t.Logf("%s (node %d) -> %s (node %d) on %s: ib_send_lat %d x %d B round trips, %s",
			cli.name, cli.node, srv.name, srv.node, job.rails[0].name, lat.Iters, lat.Bytes, typical)
	}
	if len(job.rails) > 1 {
		job.railsClean(t)
	}
}

// waitSending waits for w's devices to have sent RoCE packets, twice
// looked at: the transfer is under way.
func (job railWorkers) waitSending(t *testing.T, w spanWorker) {
	t.Helper()
	read := func() int64 {
		var n int64
		for _, c := range job.counters(t, w) {
			n += c.RDMASent
		}
		return n
	}
	first := read()
	// Four minutes: mpirun's ssh launch and the ranks' start took more
	// than one on a slow pair (2026-11-28: the allreduce subtest 207 s).
	err := cririg.Wait(4*time.Minute, w.name+" sending", func() (bool, error) {
		return read() > first+100, nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
