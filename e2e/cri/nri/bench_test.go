//go:build e2e

package nri_test

import (
	"context"
	"flag"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/cri/nririg"
)

var (
	bench       = flag.Bool("nri.bench", false, "run TestBenchCreateContainer (make bench-nri)")
	benchBlocks = flag.Int("nri.blocks", 2, "blocks of rounds with and without the plugin, alternating")
	benchRounds = flag.Int("nri.rounds", 8, "containers per block")
)

// What the plugin adds to a container's start: CreateContainer +
// StartContainer of an unprivileged container in a pod holding its RDMA
// device, with rdma-netns-nri connected and without it, in alternating
// blocks of the same run (the plugin is stopped and started between
// blocks; a block starts once containerd has seen it come or go). Prints
// figures; asserts nothing about them.
func TestBenchCreateContainer(t *testing.T) {
	if !*bench {
		t.Skip("a benchmark: make bench-nri (-nri.bench)")
	}
	pod := runPod(t, cririg.PodSpec{Name: "nri-bench", Handler: "rdma-eth1"})
	var with, without []time.Duration
	logStart := nririg.PluginLog.Lines()
	for b := 0; b < 2**benchBlocks; b++ {
		on := b%2 == 0
		if !on {
			plugin.Stop()
			// containerd drops a plugin whose connection closed at its
			// next request; let it see the close first.
			time.Sleep(500 * time.Millisecond)
		} else if b > 0 {
			var err error
			if plugin, err = nririg.StartPlugin(); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < *benchRounds; i++ {
			d := createStart(t, pod, fmt.Sprintf("b%d-%d", b, i), on)
			if on {
				with = append(with, d)
			} else {
				without = append(without, d)
			}
		}
	}
	handler := handlerTimes(nririg.PluginLog.Since(logStart))
	mw, mo := median(with), median(without)
	var b strings.Builder
	runtime := "containerd"
	if v, err := ctd.Runtime.Version(context.Background(), &runtimeapi.VersionRequest{}); err == nil {
		runtime += " " + v.GetRuntimeVersion()
	}
	fmt.Fprintf(&b, "CreateContainer+StartContainer of an unprivileged container in a pod holding its RDMA device (%s, qemu TCG)\n", runtime)
	fmt.Fprintf(&b, "%d blocks of %d containers, alternating with and without rdma-netns-nri\n", 2**benchBlocks, *benchRounds)
	fmt.Fprintf(&b, "%-36s %9s %9s %9s\n", "", "median", "p25", "p75")
	fmt.Fprintf(&b, "%-36s %9s %9s %9s\n", "without the plugin", ms(mo), ms(pct(without, 25)), ms(pct(without, 75)))
	fmt.Fprintf(&b, "%-36s %9s %9s %9s\n", "with rdma-netns-nri", ms(mw), ms(pct(with, 25)), ms(pct(with, 75)))
	fmt.Fprintf(&b, "%-36s %9s (%+.1f%%)\n", "added per container (medians)", ms(mw-mo), 100*float64(mw-mo)/float64(mo))
	fmt.Fprintf(&b, "%-36s %9s %9s %9s  (%d calls, from its log)\n", "the plugin's CreateContainer handler", ms(median(handler)), ms(pct(handler, 25)), ms(pct(handler, 75)), len(handler))
	fmt.Printf("=== NRI BENCH BEGIN ===\n%s=== NRI BENCH END ===\n", b.String())
}

// createStart times CreateContainer + StartContainer, checks the container
// got (or not) its devices, and removes it.
func createStart(t *testing.T, pod *cririg.Pod, name string, adjusted bool) time.Duration {
	t.Helper()
	spec := unprivileged(name)
	start := time.Now()
	c := runContainer(t, pod, spec)
	d := time.Since(start)
	w := inspect(t, c)
	if (len(w.Nodes) > 0) != adjusted {
		t.Fatalf("container %s: devices %v, want adjusted %v", name, w.Nodes, adjusted)
	}
	bg := context.Background()
	ctd.Runtime.StopContainer(bg, &runtimeapi.StopContainerRequest{ContainerId: c.ID, Timeout: 0})
	ctd.Runtime.RemoveContainer(bg, &runtimeapi.RemoveContainerRequest{ContainerId: c.ID})
	return d
}

var handlerTime = regexp.MustCompile(`holds .*\(([0-9.]+)(µs|ms|s)\)$`)

// handlerTimes reads the time the plugin's log gives each adjustment.
func handlerTimes(log string) []time.Duration {
	var out []time.Duration
	for _, l := range strings.Split(log, "\n") {
		m := handlerTime.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		d, err := time.ParseDuration(m[1] + m[2])
		if err == nil {
			out = append(out, d)
		}
	}
	return out
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)*p/100]
}

func median(ds []time.Duration) time.Duration { return pct(ds, 50) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }
