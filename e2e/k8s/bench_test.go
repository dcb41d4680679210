//go:build e2e

package k8s

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// benchRounds is how many pods of each kind TestBenchPodStart starts
// for each count of attachments (make bench-k8s); 0 skips it, as make
// e2e-k8s does.
var benchRounds = flag.Int("k8s.bench", 0, "TestBenchPodStart: pods to start with and without rdma-netns in the NADs' chain, interleaved, for each count of attachments (0: skip)")

// benchAttachments are the counts of attachments per pod TestBenchPodStart
// runs rounds of. The default, one, is the bench as it was before it had
// counts: one NAD on eth1.
var benchAttachments = flag.String("k8s.bench-attachments", "1", "TestBenchPodStart: comma-separated counts of attachments per pod, each a NAD of its own NIC (eth1 on); rounds of each")

// TestBenchPodStart prints the time from pod create to Running under
// kubelet and Multus (thick), for a pod on n NADs whose chain is
// host-device then rdma-netns and for one on n NADs whose chain is
// host-device alone, on the same n NICs, for each count n of
// -k8s.bench-attachments. The kinds are interleaved (the order alternates
// each round) and so are the counts, so that the machine's load falls on
// all alike: the ratio of the medians is what rdma-netns adds to a pod's
// start as a user sees it, and the per-round difference over n what it
// adds per attachment. Figures only, nothing timed is asserted; each pod
// must still come up with every RDMA device where its chain puts it, and
// every NIC and device must be home after its delete.
func TestBenchPodStart(t *testing.T) {
	if *benchRounds < 1 {
		t.Skip("a benchmark: make bench-k8s runs it (-k8s.bench N)")
	}
	counts, err := attachmentCounts(*benchAttachments)
	if err != nil {
		t.Fatal(err)
	}
	nics := benchNICs(t, slices.Max(counts))
	createBenchNADs(t, nics)
	times := map[int]map[string][]podTimes{}
	for _, n := range counts {
		times[n] = map[string][]podTimes{}
	}
	for i := range *benchRounds {
		for j, n := range counts {
			// By round and count: each count's order alternates by
			// round, and the counts of a round alternate which kind
			// runs first.
			for _, k := range benchOrder(i + j) {
				name := fmt.Sprintf("%s-%datt-%d", k.key, n, i)
				pt := benchPod(t, name, k, nics[:n])
				times[n][k.key] = append(times[n][k.key], pt)
				t.Logf("%s: Running %s after create, gone with %s home %s after delete", name, pt.start.Round(time.Millisecond), nicSpan(nics[:n]), pt.stop.Round(time.Millisecond))
			}
		}
	}
	fmt.Printf("=== K8S BENCH BEGIN ===\n%s=== K8S BENCH END ===\n", benchTable(t, counts, times))
}

// attachmentCounts parses -k8s.bench-attachments: positive counts, each
// given once, kept in the order given.
func attachmentCounts(s string) ([]int, error) {
	var counts []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-k8s.bench-attachments %q: %q is not a count of attachments (a positive integer)", s, f)
		}
		if slices.Contains(counts, n) {
			return nil, fmt.Errorf("-k8s.bench-attachments %q: %d is given twice", s, n)
		}
		counts = append(counts, n)
	}
	return counts, nil
}

// benchNICs are the test NICs eth1..eth<n>: a pod's attachment k is on
// ethk, as the bench's one attachment was on eth1 before it had counts.
func benchNICs(t *testing.T, n int) []rig.NIC {
	t.Helper()
	all, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	var nics []rig.NIC
	for k := 1; k <= n; k++ {
		i := slices.IndexFunc(all, func(nic rig.NIC) bool { return nic.Netdev == fmt.Sprintf("eth%d", k) })
		if i < 0 {
			t.Fatalf("-k8s.bench-attachments up to %d needs the test NICs eth1..eth%d; the VM has no eth%d (%d NICs: boot it with vm-run.sh --nics %d)", n, n, k, len(all), n+1)
		}
		nics = append(nics, all[i])
	}
	return nics
}

// benchKind is one of the two NAD chains TestBenchPodStart compares.
type benchKind struct {
	key   string // its NADs' and pods' names start with it
	label string // the chain, in the table
	rdma  bool   // rdma-netns in the chain: the pod gets the NICs' RDMA devices
}

var benchKinds = []benchKind{
	{key: "bench-rdma", label: "host-device, rdma-netns", rdma: true},
	{key: "bench-plain", label: "host-device", rdma: false},
}

// benchOrder is the kinds in the order of round i: alternating, so that
// neither kind always runs first and the machine's load falls on both
// alike.
func benchOrder(i int) []benchKind {
	if i%2 == 1 {
		return []benchKind{benchKinds[1], benchKinds[0]}
	}
	return benchKinds
}

// nad is the name of the kind's NAD on nic.
func (k benchKind) nad(nic rig.NIC) string { return k.key + "-" + nic.Netdev }

// networks is a pod's Multus annotation for the kind's NADs on nics, which
// Multus attaches in this order (net1 on the first NIC).
func (k benchKind) networks(nics []rig.NIC) string {
	var names []string
	for _, nic := range nics {
		names = append(names, k.nad(nic))
	}
	return strings.Join(names, ",")
}

// createBenchNADs creates both kinds' NADs on each NIC, host-device with a
// static address of a /29 of the NIC's own (eth1's 10.100.101.0/29, as
// the bench had before it had counts), so that a pod's attachments never
// share a subnet. Both kinds of a NIC share its subnet: their pods never
// run at once.
func createBenchNADs(t *testing.T, nics []rig.NIC) {
	t.Helper()
	for i, nic := range nics {
		addr := fmt.Sprintf("10.100.%d.1/29", 101+i)
		nad(t, "default", benchKinds[0].nad(nic), nic.Netdev, addr, "")
		plainNAD(t, benchKinds[1].nad(nic), nic.Netdev, addr)
	}
}

// plainNAD is nad's chain without rdma-netns: the pod gets the NIC, its
// RDMA device stays on the node.
func plainNAD(t *testing.T, name, netdev, addr string) {
	t.Helper()
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [
  {"type": "host-device", "device": %q, "ipam": {"type": "static", "addresses": [{"address": %q}]}}]}`, name, netdev, addr)
	manifest := fmt.Sprintf("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: %s\n  namespace: default\nspec:\n  config: %q\n", name, conf)
	if err := apply(ctx(t), []byte(manifest)); err != nil {
		t.Fatalf("NAD %s on %s: %v", name, netdev, err)
	}
}

// podTimes is one bench pod's create -> Running and delete -> gone with
// its NICs and devices home.
type podTimes struct{ start, stop time.Duration }

// benchPod starts a tools pod on the kind's NADs of nics, checks where
// each NIC's RDMA device is, deletes the pod and returns both times.
func benchPod(t *testing.T, name string, k benchKind, nics []rig.NIC) podTimes {
	t.Helper()
	start := startBenchPod(t, name, k, nics)
	checkBenchPod(t, name, k, nics)
	return podTimes{start: start, stop: stopBenchPod(t, name, nics)}
}

// benchTimeout is a wait's limit for a pod of n attachments: Multus's
// daemon runs the attachments' chains one after another, each plugin a
// fresh process in the emulated CPU, so a pod with more takes longer. The
// 20 s per further attachment is a margin, not a measurement.
func benchTimeout(base time.Duration, n int) time.Duration {
	return base + time.Duration(n-1)*20*time.Second
}

// startBenchPod creates the pod and waits (watching, not polling) for it
// to be Running, and returns how long that took from the create.
func startBenchPod(t *testing.T, name string, k benchKind, nics []rig.NIC) time.Duration {
	t.Helper()
	return startTimed(t, toolsPod("default", name, k.networks(nics)), len(nics))
}

// startTimed creates pod, whose networks have n attachments, and waits
// (watching, not polling) for it to be Running; it returns how long that
// took from the create.
func startTimed(t *testing.T, pod *corev1.Pod, n int) time.Duration {
	t.Helper()
	name, nets := pod.Name, pod.Annotations["k8s.v1.cni.cncf.io/networks"]
	timeout := benchTimeout(3*time.Minute, n)
	// A context of its own: ctx(t)'s five minutes could end the watch
	// before the timeout of a pod with many attachments.
	wctx, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	w, err := cs.CoreV1().Pods("default").Watch(wctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		t.Fatalf("watch pod %s: %v", name, err)
	}
	defer w.Stop()
	created := time.Now()
	createPod(t, pod)
	expired := time.After(timeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("pod %s (%s): the API server closed the watch before the pod was Running\nevents:\n%s", name, nets, events(t, "default", name))
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted && p.Status.Phase == corev1.PodRunning {
				return time.Since(created)
			}
		case <-expired:
			t.Fatalf("pod %s (%s): not Running after %s\nevents:\n%s", name, nets, timeout, events(t, "default", name))
		}
	}
}

// checkBenchPod: with rdma-netns in the chain, every NIC's RDMA device is
// in the pod's netns and gone from the host's; without it, every one
// stays on the host and the pod has none of them.
func checkBenchPod(t *testing.T, name string, k benchKind, nics []rig.NIC) {
	t.Helper()
	netns := mustNetns(t, "default", name)
	inPod, err := rig.RDMAIn(netns)
	if err != nil {
		t.Fatalf("pod %s: list the RDMA devices of its netns %s: %v", name, netns, err)
	}
	onHost, err := rig.RDMAIn("")
	if err != nil {
		t.Fatalf("pod %s: list the host's RDMA devices: %v", name, err)
	}
	var misplaced []string
	for _, nic := range nics {
		if rig.Contains(inPod, nic.RDMA) != k.rdma || rig.Contains(onHost, nic.RDMA) == k.rdma {
			misplaced = append(misplaced, nic.RDMA+" of "+nic.Netdev)
		}
	}
	if len(misplaced) > 0 {
		want := "on the host"
		if k.rdma {
			want = "in the pod"
		}
		t.Fatalf("pod %s (%s): %v not %s; the pod has RDMA devices %v, the host %v", name, k.networks(nics), misplaced, want, inPod, onHost)
	}
}

// stopBenchPod deletes the pod and returns how long it took until the
// pod was gone and every NIC and RDMA device was back on the host under
// its own name.
func stopBenchPod(t *testing.T, name string, nics []rig.NIC) time.Duration {
	t.Helper()
	deleted := time.Now()
	zero := int64(0)
	deletePod(t, "default", name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	var away []string
	err := cririg.Wait(benchTimeout(time.Minute, len(nics)), nicSpan(nics)+" and their RDMA devices back on the host", func() (bool, error) {
		var err error
		away, err = rig.Missing(nics)
		return len(away) == 0 && err == nil, err
	})
	if err != nil {
		t.Fatalf("after pod %s's delete: %v; still away: %v", name, err, away)
	}
	return time.Since(deleted)
}

// nicSpan names nics for a log line: "eth1", "eth1..eth4".
func nicSpan(nics []rig.NIC) string {
	if len(nics) == 1 {
		return nics[0].Netdev
	}
	return nics[0].Netdev + ".." + nics[len(nics)-1].Netdev
}

// benchTable is, for each count, the kinds' medians, their ratio and the
// median per-attachment difference.
func benchTable(t *testing.T, counts []int, times map[int]map[string][]podTimes) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pod create -> Running and delete -> gone with its NICs home (kubelet %s, Multus thick, containerd), %d pods of each kind per count, interleaved\n", kubeletVersion(t), *benchRounds)
	fmt.Fprintf(&b, "TCG-emulated node (qemu, no KVM) on shared cores: the seconds are noisy and no hardware's; the ratio rdma/plain is the figure\n")
	fmt.Fprintf(&b, "%-11s %-32s %10s %10s %10s %14s\n", "attachments", "NAD chain (each on a NIC)", "start p50", "min", "max", "delete p50")
	for _, n := range counts {
		rdma, plain := times[n][benchKinds[0].key], times[n][benchKinds[1].key]
		for _, k := range benchKinds {
			s := stats(startsOf(times[n][k.key]))
			fmt.Fprintf(&b, "%-11d %-32s %9.2fs %9.2fs %9.2fs %13.2fs\n", n, k.label, s.p50, s.min, s.max, stats(stopsOf(times[n][k.key])).p50)
		}
		fmt.Fprintf(&b, "%-11s rdma/plain %s start p50; rdma-netns adds %+.2fs per attachment (median over rounds of (rdma - plain) / %d)\n",
			"", ratio(stats(startsOf(rdma)).p50, stats(startsOf(plain)).p50), stats(perAttachment(rdma, plain, n)).p50, n)
	}
	return b.String()
}

func startsOf(ts []podTimes) []time.Duration {
	var ds []time.Duration
	for _, pt := range ts {
		ds = append(ds, pt.start)
	}
	return ds
}

func stopsOf(ts []podTimes) []time.Duration {
	var ds []time.Duration
	for _, pt := range ts {
		ds = append(ds, pt.stop)
	}
	return ds
}

// perAttachment is each round's start difference between the kinds over
// n: rounds pair the kinds, which ran one right after the other.
func perAttachment(rdma, plain []podTimes, n int) []time.Duration {
	var ds []time.Duration
	for i := range min(len(rdma), len(plain)) {
		ds = append(ds, (rdma[i].start-plain[i].start)/time.Duration(n))
	}
	return ds
}

// ratio is a/b as "1.03x", or "-" without b.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a/b)
}

type summary struct{ p50, min, max float64 }

// stats is the summary of durations, in seconds.
func stats(ds []time.Duration) summary {
	secs := make([]float64, len(ds))
	for i, d := range ds {
		secs[i] = d.Seconds()
	}
	return statsOf(secs)
}

// statsOf is the summary of figures of any unit (seconds, shares).
func statsOf(v []float64) summary {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return summary{}
	}
	return summary{p50: s[len(s)/2], min: s[0], max: s[len(s)-1]}
}

func kubeletVersion(t *testing.T) string {
	n, err := cs.CoreV1().Nodes().Get(ctx(t), "localhost", metav1.GetOptions{})
	if err != nil {
		return "?"
	}
	return n.Status.NodeInfo.KubeletVersion
}
