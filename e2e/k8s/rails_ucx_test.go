//go:build e2e

package k8s

// UCX's rail counts over TestTwoNodes's four rails (make bench-nodes).
// ucxOver raises UCX_MAX_EAGER_RAILS and UCX_MAX_RNDV_RAILS to the rail
// count, and so UCX on rxe (ud_verbs) spreads the allreduce evenly over
// all four (allreduceOverRDMA). A user who lists the rails in
// UCX_NET_DEVICES and leaves the counts alone gets UCX's defaults (1.13:
// eager messages on one rail, rendezvous on two): what those do with four
// rails is what this measures.

import (
	"flag"
	"fmt"
	"strings"
	"testing"
)

// ucxRailBenchRounds is how many allreduces of each kind TestBenchRailsUCX
// runs (make bench-nodes); 0 skips it, as make e2e-k8s-nodes does.
var ucxRailBenchRounds = flag.Int("k8s.bench-ucx-rails", 0, "TestBenchRailsUCX: allreduces over four rails at UCX's default rail counts and at ucxOver's (every rail), alternated (0: skip)")

// ucxRailBytes and ucxRailIters are the allreduce of TestTwoNodes's
// allreduce subtest, so that the figures compare with its.
const ucxRailBytes, ucxRailIters = 1 << 20, 5

// ucxRailKind is one of the UCX settings TestBenchRailsUCX alternates.
type ucxRailKind struct {
	label string
	args  []string // mpirun's transport settings
}

// ucxRailRun is one allreduce: its time as allreduce.py measured it (the
// iterations, not mpirun's launch) and each worker's packets per rail.
type ucxRailRun struct {
	seconds float64
	rails   [2][]railCounters // per worker, per rail of the job
}

// TestBenchRailsUCX prints how UCX spreads an allreduce between one pod
// per node holding four rails (TestTwoNodes's job, startJob) at its
// default rail counts and at ucxOver's (every rail), rounds of each
// alternated with the order alternating, so that the machine's load falls
// on both alike: per kind the allreduce's time, and per rail its share of
// the RoCE packets worker 0 sent. Figures only: each allreduce must pass
// and move its bytes over RDMA, however UCX spreads them.
func TestBenchRailsUCX(t *testing.T) {
	requireRailBench(t, *ucxRailBenchRounds, "k8s.bench-ucx-rails")
	// As TestTwoNodes: the image import and the NADs' apply are
	// idempotent, the Secret gets a new key, so that this runs the same
	// after TestBenchJobStart or alone.
	waitJoined(t, 2, "")
	importMPIImage(t)
	createMPISecret(t)
	job := startJob(t)
	mtu := activeMTU(t, job.pods[0], job.rails[0].name)
	kinds := []ucxRailKind{
		{"UCX defaults (eager 1, rndv 2)", ucxAtDefaultRails(job.devNames()...)},
		{fmt.Sprintf("UCX_MAX_{EAGER,RNDV}_RAILS=%d", len(job.rails)), job.ucx()},
	}
	runs := make([][]ucxRailRun, len(kinds))
	for i := range *ucxRailBenchRounds {
		for j := range kinds {
			if i%2 == 1 {
				j = len(kinds) - 1 - j
			}
			runs[j] = append(runs[j], job.ucxRailRun(t, kinds[j], mtu))
			t.Logf("round %d, %s: %s", i+1, kinds[j].label, job.describeUCXRun(runs[j][len(runs[j])-1]))
		}
	}
	job.stop(t)
	fmt.Printf("=== K8S UCX RAILS BENCH BEGIN ===\n%s=== K8S UCX RAILS BENCH END ===\n", job.ucxRailTable(kinds, runs))
}

// ucxRailRun runs one allreduce of kind k and reads both workers' rails'
// counters around it. It fails t unless each worker's rails together sent
// and received at least the job's bytes at the path MTU, as in
// allreduceOverRDMA: the job ran over RDMA, on whichever rails.
func (job railWorkers) ucxRailRun(t *testing.T, k ucxRailKind, mtu int64) ucxRailRun {
	t.Helper()
	workers := job.pods[:]
	before := job.countersNow(t)
	r, _ := runAllreduceWith(t, workers, "RDMA, "+k.label, k.args, ucxRailBytes, ucxRailIters)
	run := ucxRailRun{seconds: r.Seconds, rails: job.countersSince(t, before)}
	need := r.BytesSent / mtu
	for w, wk := range workers {
		var sent, rcvd int64
		for _, c := range run.rails[w] {
			sent, rcvd = sent+c.RDMASent, rcvd+c.RDMARcvd
		}
		if sent < need || rcvd < need {
			t.Errorf("allreduce over RDMA, %s: %s's rails sent %d and received %d RoCE packets, want >= %d each (%d B at MTU %d)",
				k.label, wk.name, sent, rcvd, need, r.BytesSent, mtu)
		}
	}
	return run
}

// describeUCXRun is a run in one line: its time and every rail's RoCE
// packets sent/received in each worker.
func (job railWorkers) describeUCXRun(run ucxRailRun) string {
	var per []string
	for w, wk := range job.pods {
		for rl, r := range job.rails {
			c := run.rails[w][rl]
			per = append(per, fmt.Sprintf("%s %s %d/%d", wk.name, r.name, c.RDMASent, c.RDMARcvd))
		}
	}
	return fmt.Sprintf("allreduce %.2f s; RoCE packets sent/received per rail: %s", run.seconds, strings.Join(per, ", "))
}

// sentShares are each rail's percentage of the RoCE packets worker w sent
// in run, and their total.
func sentShares(run ucxRailRun, w int) ([]float64, int64) {
	var total int64
	for _, c := range run.rails[w] {
		total += c.RDMASent
	}
	shares := make([]float64, len(run.rails[w]))
	for rl, c := range run.rails[w] {
		if total > 0 {
			shares[rl] = 100 * float64(c.RDMASent) / float64(total)
		}
	}
	return shares, total
}

// ucxRailTable is, per kind, the allreduce's median time (min, max), the
// median of worker 0's RoCE packets sent over all rails, and each rail's
// median share of them.
func (job railWorkers) ucxRailTable(kinds []ucxRailKind, runs [][]ucxRailRun) string {
	var b strings.Builder
	fmt.Fprintf(&b, "allreduce.py %d B x %d (+1 warm-up), 2 ranks (one per node), UCX ud_verbs, UCX_NET_DEVICES listing %s; %d runs of each kind, alternated\n",
		ucxRailBytes, ucxRailIters, strings.Join(job.devNames(), ", "), *ucxRailBenchRounds)
	fmt.Fprintf(&b, "TCG-emulated nodes: noisy, the times compare nothing about hardware; the figure is how UCX spreads worker 0's RoCE packets sent (median total, each rail's median share)\n")
	fmt.Fprintf(&b, "%-32s %13s %7s %7s %9s", "UCX rail counts", "allreduce p50", "min", "max", "sent p50")
	for _, n := range job.devNames() {
		fmt.Fprintf(&b, " %8s", n)
	}
	b.WriteString("\n")
	for j, k := range kinds {
		var secs, totals []float64
		shares := make([][]float64, len(job.rails))
		for _, run := range runs[j] {
			secs = append(secs, run.seconds)
			s, total := sentShares(run, 0)
			totals = append(totals, float64(total))
			for rl := range shares {
				shares[rl] = append(shares[rl], s[rl])
			}
		}
		st := statsOf(secs)
		fmt.Fprintf(&b, "%-32s %12.2fs %6.2fs %6.2fs %9.0f", k.label, st.p50, st.min, st.max, statsOf(totals).p50)
		for _, s := range shares {
			fmt.Fprintf(&b, " %6.1f %%", statsOf(s).p50)
		}
		b.WriteString("\n")
	}
	return b.String()
}
