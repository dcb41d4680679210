//go:build e2e

package k8s

// Job start across the two nodes (make bench-nodes): how long a two-rank
// MPI job of mpi_test.go takes from its pods' creation to the end of its
// first allreduce, with rdma-netns in the NAD's chain and without it.

import (
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// jobBenchRounds is how many jobs of each kind TestBenchJobStart starts
// (make bench-nodes); 0 skips it, as make e2e-k8s-nodes does.
var jobBenchRounds = flag.Int("k8s.bench-jobs", 0, "TestBenchJobStart: two-node MPI jobs to start with and without rdma-netns in the NAD's chain, alternated (0: skip)")

const (
	// plainJobNetwork is nad-renamed's chain without rdma-netns: the pods
	// get the NIC, its RDMA device stays on the node.
	plainJobNetwork = "bench-job-plain"
	// jobLabel names the job a worker belongs to, for the watch.
	jobLabel = "rdma-netns.test/bench-job"
	// jobBytes and jobIters are the job's allreduce: small, so that the
	// figure is the job's start rather than its transfer.
	jobBytes, jobIters = 1 << 20, 1
)

// jobKind is one of the two jobs TestBenchJobStart alternates.
type jobKind struct {
	key     string // in the pods' names
	label   string // the NAD's chain and the transport, in the table
	network string
	tr      mpiTransport
	devs    []string // the RDMA devices each worker must see
}

// jobTimes is one job's start, split where a user would see it: both
// pods Running, both sshds listening (when the MPI Operator's launcher
// can start), the first allreduce done. stop is the delete until both
// pods are gone and both nodes have their NIC and RDMA device back.
type jobTimes struct{ running, sshd, allreduce, stop time.Duration }

func (j jobTimes) start() time.Duration { return j.running + j.sshd + j.allreduce }

// TestBenchJobStart prints the time from the creation of a two-rank MPI
// job's pods (one per node, placed by the scheduler) to the end of its
// first allreduce: on nad-renamed, whose chain moves each node's RDMA
// device into its pod (the job runs over RDMA), and on the same chain
// without rdma-netns (the device stays on the node, the job can only run
// over TCP). One job of each first, not counted (the first pods and
// mpirun of the image on each node read its files from disk), then
// -k8s.bench-jobs of each, alternated with the order alternating each
// round, so that the machine's load falls on both alike. Figures only,
// nothing timed is asserted; each job must still pass with its pods
// seeing what their NAD gives them, and every NIC and device come home.
func TestBenchJobStart(t *testing.T) {
	if *jobBenchRounds == 0 {
		t.Skip("a benchmark: make bench-nodes runs it (-k8s.bench-jobs N)")
	}
	if *nodes < 2 {
		t.Skip("one node: make bench-nodes's two-node boot runs this (-k8s.nodes 2)")
	}
	waitJoined(t, 2, "")
	importMPIImage(t)
	applyManifest(t, "nad-renamed")
	plain := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": %q, "plugins": [
  {"type": "host-device", "device": %q, "capabilities": {"ips": true}, "ipam": {"type": "static"}}]}`, plainJobNetwork, twoNodeNIC)
	if err := apply(ctx(t), []byte(fmt.Sprintf("apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata:\n  name: %s\n  namespace: %s\nspec:\n  config: %q\n", plainJobNetwork, workersNS, plain))); err != nil {
		t.Fatalf("NAD %s: %v", plainJobNetwork, err)
	}
	createMPISecret(t)
	kinds := []jobKind{
		{"rdma", "host-device, rdma-netns (RDMA)", twoNodeNetwork, overRDMA, []string{twoNodeName}},
		{"plain", "host-device (TCP)", plainJobNetwork, overTCP, nil},
	}
	for _, k := range kinds {
		j := runJob(t, k, "warm")
		t.Logf("job-%s-warm (not counted): %s", k.key, j)
	}
	times := map[string][]jobTimes{}
	for i := range *jobBenchRounds {
		order := kinds
		if i%2 == 1 {
			order = []jobKind{kinds[1], kinds[0]}
		}
		for _, k := range order {
			j := runJob(t, k, strconv.Itoa(i))
			times[k.key] = append(times[k.key], j)
			t.Logf("job-%s-%d: %s", k.key, i, j)
		}
	}
	fmt.Printf("=== K8S JOB BENCH BEGIN ===\n%s=== K8S JOB BENCH END ===\n", jobTable(t, kinds, times))
}

func (j jobTimes) String() string {
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }
	return fmt.Sprintf("allreduce done %s after create (both pods Running %s, sshds listening %s later, allreduce %s later); deleted, NICs and devices home %s after delete",
		r(j.start()), r(j.running), r(j.sshd), r(j.allreduce), r(j.stop))
}

// jobTable is the medians of each kind's jobs and their difference.
func jobTable(t *testing.T, kinds []jobKind, times map[string][]jobTimes) string {
	of := func(k string, part func(jobTimes) time.Duration) summary {
		var ds []time.Duration
		for _, j := range times[k] {
			ds = append(ds, part(j))
		}
		return stats(ds)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "job start: 2 worker pods created (one per node, by the scheduler) -> the end of the first allreduce (%d B x %d + 1 warm-up, 2 ranks)\n", jobBytes, jobIters)
	fmt.Fprintf(&b, "kubelet %s, Multus thick, containerd; %d jobs of each, alternated, after one uncounted job of each\n", kubeletVersion(t), *jobBenchRounds)
	fmt.Fprintf(&b, "%-32s %10s %9s %9s %12s %10s %14s %10s\n", "NAD chain (transport)", "start p50", "min", "max", "Running p50", "sshd p50", "allreduce p50", "stop p50")
	for _, k := range kinds {
		s := of(k.key, jobTimes.start)
		fmt.Fprintf(&b, "%-32s %9.2fs %8.2fs %8.2fs %11.2fs %9.2fs %13.2fs %9.2fs\n", k.label, s.p50, s.min, s.max,
			of(k.key, func(j jobTimes) time.Duration { return j.running }).p50,
			of(k.key, func(j jobTimes) time.Duration { return j.sshd }).p50,
			of(k.key, func(j jobTimes) time.Duration { return j.allreduce }).p50,
			of(k.key, func(j jobTimes) time.Duration { return j.stop }).p50)
	}
	ready := func(j jobTimes) time.Duration { return j.running + j.sshd }
	fmt.Fprintf(&b, "with rdma-netns, median job start %+.2fs; median to both sshds listening (before the transports differ) %+.2fs\n",
		of(kinds[0].key, jobTimes.start).p50-of(kinds[1].key, jobTimes.start).p50,
		of(kinds[0].key, ready).p50-of(kinds[1].key, ready).p50)
	return b.String()
}

// runJob starts one job of kind k, runs its first allreduce, checks what
// its workers and nodes hold, and stops it.
func runJob(t *testing.T, k jobKind, id string) jobTimes {
	t.Helper()
	job := "job-" + k.key + "-" + id
	// The test's pair of workers (their nodes and addresses), named for
	// this job.
	workers := spanWorkerPair()
	for i := range workers {
		workers[i].name = fmt.Sprintf("%s-%d", job, i)
	}
	w, err := cs.CoreV1().Pods(workersNS).Watch(ctx(t), metav1.ListOptions{LabelSelector: jobLabel + "=" + job})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	created := time.Now()
	for _, wk := range workers {
		createPod(t, jobWorkerPod(wk, k.network, job))
		t.Cleanup(func() { deletePod(t, workersNS, wk.name, workersGrace) })
	}
	running := waitJobRunning(t, w, workers)
	for _, wk := range workers {
		waitSSHD(t, wk)
	}
	listening := time.Now()
	runAllreduce(t, workers, k.tr, jobBytes, jobIters)
	done := time.Now()
	for _, wk := range workers {
		checkJobWorker(t, k, wk)
	}
	deleted := time.Now()
	railWorkers{pods: [2]spanWorker{workers[0], workers[1]}, rails: []rail{renamedRail}}.stop(t)
	return jobTimes{running: running.Sub(created), sshd: listening.Sub(running), allreduce: done.Sub(listening), stop: time.Since(deleted)}
}

// jobWorkerPod is mpiWorkerPod on network, labelled with its job.
func jobWorkerPod(w spanWorker, network, job string) *corev1.Pod {
	p := mpiWorkerPod(w)
	p.Annotations["k8s.v1.cni.cncf.io/networks"] = fmt.Sprintf(`[{"name":%q,"ips":["%s/24"]}]`, network, w.ip)
	p.Labels = map[string]string{jobLabel: job}
	return p
}

// waitJobRunning watches the job's pods until both are Running and
// returns when the second was seen so.
func waitJobRunning(t *testing.T, w watch.Interface, workers []spanWorker) time.Time {
	t.Helper()
	seen := map[string]bool{}
	timeout := time.After(3 * time.Minute)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the API server closed the watch on %s's pods", workers[0].name)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted {
				continue
			}
			if p.Status.Phase == corev1.PodFailed {
				t.Fatalf("pod %s failed: %s\nevents:\n%s", p.Name, p.Status.Message, events(t, workersNS, p.Name))
			}
			if p.Status.Phase == corev1.PodRunning {
				seen[p.Name] = true
			}
			if len(seen) == len(workers) {
				return time.Now()
			}
		case <-timeout:
			var ev strings.Builder
			for _, wk := range workers {
				fmt.Fprintf(&ev, "%s (Running: %v):\n%s", wk.name, seen[wk.name], events(t, workersNS, wk.name))
			}
			t.Fatalf("the job's pods not both Running after 3m\nevents:\n%s", ev.String())
		}
	}
}

// checkJobWorker: the worker sees the RDMA devices its kind gives it
// (its netns's own, in sysfs), and its node holds neither its NIC nor, if
// the pod has it, its RDMA device.
func checkJobWorker(t *testing.T, k jobKind, w spanWorker) {
	t.Helper()
	out, stderr, err := execIn(t, workersNS, w.name, "worker", "ls", "/sys/class/infiniband")
	if err != nil {
		t.Fatalf("%s: exec ls /sys/class/infiniband: %v\n%s", w.name, err, stderr)
	}
	if devs := strings.Fields(out); !slices.Equal(devs, k.devs) {
		t.Errorf("%s on node %d (%s): sees RDMA devices %v, want %v", w.name, w.node, k.network, devs, k.devs)
	}
	st := hostOf(t, w.node)
	if rig.Contains(st.Links, twoNodeNIC) {
		t.Errorf("node %d still holds %s with %s running: links %v", w.node, twoNodeNIC, w.name, st.Links)
	}
	if home := rig.Contains(st.RDMA, twoNodeDev); home != (len(k.devs) == 0) {
		t.Errorf("node %d with %s (%s) running: holds %s: %v, want %v (RDMA %v)", w.node, w.name, k.network, twoNodeDev, home, len(k.devs) == 0, st.RDMA)
	}
}
