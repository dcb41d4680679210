// Command rdma-netns-stress hammers rdma-netns in the test VM (`make
// stress`): seeded random ADD/DEL interleavings across pods, racing ADDs
// for one device, concurrent ADD/DEL on the same and on other devices, injected faults (pod netns deleted, plugin SIGKILLed
// mid-call, corrupt state files, state directory read-only or full) and
// hostile input. After everything it checks that every RDMA device and
// netdev is back in the host and no attachment record is left; any leak or
// wrong state makes it exit 1.
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

var (
	rounds     = flag.Int("rounds", 200, "ADD/DEL rounds across the pods")
	pods       = flag.Int("pods", 8, "pods (one NIC each) in the rounds")
	workers    = flag.Int("workers", 4, "concurrent callers in the rounds")
	seed       = flag.Uint64("seed", 0, "random seed (0: from the clock)")
	races      = flag.Int("races", 20, "racing ADD pairs for one device")
	concurrent = flag.Int("concurrent", 10, "ADD+DEL rounds of each pod in the concurrent phase (two pods per device, four devices)")
	kills      = flag.Int("kills", 30, "SIGKILL fault rounds")
	reboots    = flag.Int("reboots", 5, "rounds of every pod netns deleted at once without DEL")
	verbose    = flag.Bool("v", false, "log every ADD/DEL of the rounds")
)

type stats struct {
	rounds, adds, dels          atomic.Int64
	faults                      map[string]*atomic.Int64
	races, raceWins             atomic.Int64
	concurrentCalls             atomic.Int64
	concurrentWins              atomic.Int64
	badInputs                   atomic.Int64
	killedMidFlight             atomic.Int64
	tempLeft                    atomic.Int64
	mu                          sync.Mutex
	failures                    []string
	observations                []string
	observed                    map[string]bool
	leakedDevices, leftoverRecs int
}

var st = &stats{faults: map[string]*atomic.Int64{}, observed: map[string]bool{}}

func fault(kind string) {
	st.mu.Lock()
	c, ok := st.faults[kind]
	if !ok {
		c = &atomic.Int64{}
		st.faults[kind] = c
	}
	st.mu.Unlock()
	c.Add(1)
}

func failf(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	st.mu.Lock()
	st.failures = append(st.failures, s)
	st.mu.Unlock()
	fmt.Printf("stress: FAIL: %s\n", s)
}

// observe records a behaviour worth reporting (not a failure), once per
// format string.
func observe(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	st.mu.Lock()
	defer st.mu.Unlock()
	// once per kind: the arguments (paths, device names) vary
	if !st.observed[format] {
		st.observed[format] = true
		st.observations = append(st.observations, s)
		fmt.Printf("stress: note: %s\n", s)
	}
}

func logf(format string, a ...any) {
	fmt.Printf("stress: %s\n", fmt.Sprintf(format, a...))
}

func main() {
	flag.Parse()
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	start := time.Now()
	logf("seed %d (rerun with -seed %d), rounds %d, pods %d, workers %d, races %d, kills %d", *seed, *seed, *rounds, *pods, *workers, *races, *kills)
	nics, err := rig.Layout()
	if err != nil {
		fmt.Printf("stress: FAIL: %v\n", err)
		os.Exit(2)
	}
	if len(nics) < *pods+2 {
		fmt.Printf("stress: FAIL: needs %d NICs (pods + 2 spares), the VM has %d\n", *pods+2, len(nics))
		os.Exit(2)
	}
	rng := rand.New(rand.NewPCG(*seed, 0x5eed))
	phase := func(name string, f func()) {
		t0 := time.Now()
		logf("--- %s", name)
		f()
		if missing, err := rig.WaitHome(nics, 5*time.Second); err != nil || len(missing) > 0 {
			failf("after %s: not back in the host: %v %v", name, missing, err)
		}
		if recs := rig.StateFiles(rig.StateDir); len(recs) > 0 {
			failf("after %s: state files left: %v", name, recs)
		}
		logf("--- %s done in %s", name, time.Since(t0).Round(time.Millisecond))
	}
	phase("random ADD/DEL rounds", func() { randomRounds(nics[:*pods], rng.Uint64()) })
	spare := nics[len(nics)-1]
	phase("racing ADDs for one device", func() { raceAdds(spare) })
	phase("concurrent ADD/DEL on the same and on other devices", func() { concurrentAddDel(nics[:4], rng.Uint64()) })
	phase("SIGKILL during ADD and DEL", func() { killRounds(nics[*pods:*pods+2], rand.New(rand.NewPCG(rng.Uint64(), 1))) })
	phase("corrupt state files", func() { corruptState(nics[*pods], nics[*pods+1]) })
	phase("reboot: pod netns gone without DEL", func() { rebootRounds(nics[:4], *reboots) })
	phase("state directory wiped", func() { wipedState(nics[:4]) })
	phase("read-only and full state directory", func() { unwritableState(nics[*pods]) })
	phase("bad input", func() { badInput(nics[*pods], nics[*pods+1]) })

	// Final check.
	missing, err := rig.WaitHome(nics, 5*time.Second)
	if err != nil {
		failf("final check: %v", err)
	}
	st.leakedDevices = len(missing)
	st.leftoverRecs = len(rig.StateFiles(rig.StateDir))
	if st.leakedDevices > 0 {
		failf("final check: not in the host: %v", missing)
	}
	if st.leftoverRecs > 0 {
		failf("final check: state files left in %s: %v", rig.StateDir, rig.StateFiles(rig.StateDir))
	}

	var faultTotal int64
	var faultParts []string
	for k, v := range st.faults {
		faultTotal += v.Load()
		faultParts = append(faultParts, fmt.Sprintf("%s %d", k, v.Load()))
	}
	fmt.Println("=== STRESS SUMMARY ===")
	fmt.Printf("seed:              %d\n", *seed)
	fmt.Printf("rounds run:        %d (ADD %d, DEL %d) across %d pods, %d workers\n", st.rounds.Load(), st.adds.Load(), st.dels.Load(), *pods, *workers)
	fmt.Printf("racing ADD pairs:  %d (exactly one winner each: %d)\n", st.races.Load(), st.raceWins.Load())
	fmt.Printf("concurrent calls:  %d ADD/DEL from 8 pods on 4 devices at once (%d ADDs won; never two owners of a device)\n", st.concurrentCalls.Load(), st.concurrentWins.Load())
	fmt.Printf("faults injected:   %d (%s); plugin killed mid-call %d times\n", faultTotal, strings.Join(sortedStrings(faultParts), ", "), st.killedMidFlight.Load())
	fmt.Printf("bad inputs tried:  %d\n", st.badInputs.Load())
	fmt.Printf("devices leaked:    %d\n", st.leakedDevices)
	fmt.Printf("state files left:  %d at the end (the lock file %s/lock is kept by design); temp files left by kills along the way: %d\n", st.leftoverRecs, rig.StateDir, st.tempLeft.Load())
	fmt.Printf("observations:      %d\n", len(st.observations))
	for _, o := range st.observations {
		fmt.Printf("  - %s\n", o)
	}
	fmt.Printf("failures:          %d\n", len(st.failures))
	for _, f := range st.failures {
		fmt.Printf("  - %s\n", f)
	}
	fmt.Printf("run time:          %s\n", time.Since(start).Round(time.Second))
	if len(st.failures) > 0 {
		fmt.Println("stress: FAIL")
		os.Exit(1)
	}
	fmt.Println("stress: PASS")
}

func sortedStrings(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// in reports whether dev is in the netns at nsPath ("" = host).
func in(nsPath, dev string) bool {
	devs, err := rig.RDMAIn(nsPath)
	return err == nil && rig.Contains(devs, dev)
}
