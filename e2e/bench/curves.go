package main

import (
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/internal/plot"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

var (
	concList   = flag.String("concurrent", "1,2,4,8", "curve 3: numbers of pods started at once, one NIC each")
	concRounds = flag.Int("concurrent-rounds", 5, "curve 3: interleaved rounds per point")
	moveDelays = flag.String("move-delays", "0,50", "curve 3: emulated re-registration delays of a move, ms (rdma_rxe enable_delay_ms)")
	devList    = flag.String("devices", "2,8,16,28", "curve 1: numbers of RDMA devices on the node")
	devRounds  = flag.Int("devices-rounds", 5, "curve 1: rounds over the device counts, three ADD+DEL each")
)

// delayParam is the test rxe's emulation of a slow re-registration
// (scripts/rxe/rxe-netns-move-delay.patch).
const delayParam = "/sys/module/rdma_rxe/parameters/enable_delay_ms"

func setMoveDelay(ms int) error {
	if err := os.WriteFile(delayParam, []byte(strconv.Itoa(ms)), 0o644); err != nil {
		return fmt.Errorf("setting the emulated move delay: %v (the VM's rdma_rxe lacks rxe-netns-move-delay.patch?)", err)
	}
	return nil
}

func intList(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(f)); err == nil && n >= 0 {
			out = append(out, n)
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// atOnce runs f(0..n-1) in n goroutines released together and returns the
// wall time until the last one returned.
func atOnce(n int, f func(i int) error) (time.Duration, error) {
	var wg sync.WaitGroup
	errs := make([]error, n)
	gate := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-gate
			errs[i] = f(i)
		}(i)
	}
	t0 := time.Now()
	close(gate)
	wg.Wait()
	wall := time.Since(t0)
	for _, err := range errs {
		if err != nil {
			return wall, err
		}
	}
	return wall, nil
}

// concurrentPods is curve 3: N pods started at once on distinct NICs (as
// kubelet starts a job's pods), the wall time until the last one holds
// its device, against one pod and against the kernel floor of N moves run
// at once (N floor programs, each one lookup and one move), for a cheap
// move and for one with an emulated slow re-registration.
func concurrentPods(rep *report, nics []rig.NIC) error {
	counts := intList(*concList)
	delays := intList(*moveDelays)
	defer setMoveDelay(0)
	type point struct{ ours, floor, base []time.Duration }
	haveBase := false
	if _, err := os.Stat(baseBin); err == nil {
		haveBase = true
	}
	for _, delay := range delays {
		if err := setMoveDelay(delay); err != nil {
			return err
		}
		var xs []float64
		var ours, floor, base []float64
		var oursOne time.Duration
		for _, n := range counts {
			if n > len(nics) {
				rep.note("curve 3: %d pods skipped, the VM has %d NICs", n, len(nics))
				continue
			}
			var p point
			if err := concurrentPoint(nics[:n], *concRounds, haveBase, &p.ours, &p.floor, &p.base); err != nil {
				return fmt.Errorf("curve 3, %d pods, move +%d ms: %v", n, delay, err)
			}
			sO, sF := rig.Summarize(p.ours), rig.Summarize(p.floor)
			if n == counts[0] {
				oursOne = sO.Median
			}
			section := fmt.Sprintf("pods at once, move +%d ms", delay)
			rep.add(section, fmt.Sprintf("%d at once: floor, %d moves at once", n, n), sF, 0, "", "")
			rep.add(section, fmt.Sprintf("%d at once: rdma-netns ADD, wall to the last", n), sO, sF.Median, "floor",
				fmt.Sprintf("%.2fx %d pod; per-round ratios to the floor %s", float64(sO.Median)/float64(oursOne), counts[0], spread(p.ours, p.floor)))
			xs = append(xs, float64(n))
			ours, floor = append(ours, ms(sO.Median)), append(floor, ms(sF.Median))
			if haveBase && len(p.base) == 0 {
				rep.note("curve 3: the BENCH_BASE build failed at %d pods, move +%d ms (stderr says how)", n, delay)
				base = append(base, math.NaN())
			} else if haveBase {
				sB := rig.Summarize(p.base)
				rep.add(section, fmt.Sprintf("%d at once: BENCH_BASE build ADD, wall to the last", n), sB, sF.Median, "floor", "")
				base = append(base, ms(sB.Median))
			}
			if delay == 50 && n == 8 {
				r := float64(sO.Median) / float64(sF.Median)
				rep.note("target 8 pods at once with a 50 ms emulated move <= 1.5x the floor of 8 moves at once: %s (%.2fx)", verdict(r <= 1.5), r)
			}
		}
		if len(xs) == 0 {
			continue
		}
		p := &plot.Plot{Name: fmt.Sprintf("curve3-pods-at-once-move%dms", delay),
			Title:  fmt.Sprintf("Curve 3: pods started at once, move +%d ms (emulated)", delay),
			XLabel: "pods started at once, one NIC each", YLabel: "ms until the last pod holds its device",
			Xs: xs, Series: []plot.Series{
				{Label: "rdma-netns ADD", Ys: ours},
				{Label: "floor: the same moves at once", Ys: floor, Dashed: true},
			}}
		if haveBase {
			p.Series = append(p.Series, plot.Series{Label: "BENCH_BASE build ADD", Ys: base})
		}
		p.Emit()
	}
	return nil
}

// concurrentPoint measures rounds of n ADDs at once against n floor moves
// at once (and the BENCH_BASE build's ADDs), alternating which goes first.
// The netdevs are in their pods throughout, as host-device leaves them.
func concurrentPoint(nics []rig.NIC, rounds int, withBase bool, ours, floor, base *[]time.Duration) error {
	n := len(nics)
	pods := make([]*rig.Pod, n)
	for i := range pods {
		var err error
		if pods[i], err = rig.NewPod(); err != nil {
			return err
		}
		if err := rig.MoveNetdevIn(nics[i].Netdev, pods[i].Path()); err != nil {
			return err
		}
	}
	defer func() {
		for i, p := range pods {
			rig.MoveNetdevOut(nics[i].Netdev, p.Path())
			p.Destroy()
		}
		rig.WaitHome(nics, 5*time.Second)
	}()
	call := func(bin, verb string, i int) rig.Call {
		return rig.Call{Bin: bin, Verb: verb, ContainerID: fmt.Sprintf("conc-%d", i), Netns: pods[i].Path(), IfName: nics[i].Netdev,
			Stdin: rig.PluginConf("bench-concurrent", nics[i].Netdev, pods[i].Path(), nil)}
	}
	cni := func(bin string) (time.Duration, error) {
		wall, err := atOnce(n, func(i int) error { _, err := execCNI(call(bin, "ADD", i)); return err })
		if err != nil {
			return 0, err
		}
		_, err = atOnce(n, func(i int) error { _, err := execCNI(call(bin, "DEL", i)); return err })
		return wall, err
	}
	floorMoves := func() (time.Duration, error) {
		wall, err := atOnce(n, func(i int) error { _, err := execT(floorBin, "in", nics[i].RDMA, pods[i].Path()); return err })
		if err != nil {
			return 0, err
		}
		_, err = atOnce(n, func(i int) error { _, err := execT(floorBin, "out", nics[i].RDMA, pods[i].Path()); return err })
		return wall, err
	}
	type side struct {
		run  func() (time.Duration, error)
		into *[]time.Duration
	}
	sides := []side{{func() (time.Duration, error) { return cni(rig.Plugin) }, ours}, {floorMoves, floor}}
	if withBase {
		sides = append(sides, side{func() (time.Duration, error) { return cni(baseBin) }, base})
	}
	// One warm-up round, not counted.
	for _, s := range sides {
		if _, err := s.run(); err != nil {
			return err
		}
	}
	for r := 0; r < rounds; r++ {
		for j := range sides {
			s := sides[(r+j)%len(sides)]
			d, err := s.run()
			if err != nil && s.into == base {
				// An older build may fail where this one does not (the
				// device dump's misses): say so, measure without it.
				fmt.Fprintf(os.Stderr, "[bench] BENCH_BASE build failed in round %d, left out of this point: %v\n", r, err)
				*base = nil
				return nil
			}
			if err != nil {
				return fmt.Errorf("round %d: %v", r, err)
			}
			*s.into = append(*s.into, d)
		}
	}
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "MET"
	}
	return "MISSED"
}

// deviceCounts is curve 1: ADD+DEL of one attachment against the number of
// RDMA devices on the node. The rxe devices of the other NICs are deleted
// and added again between the points (rdma link), so the node really has
// that many; the counts take turns within each round. It is taken on the
// VM's two sysfs layouts (scripts/vm-run.sh): eth1's RDMA device hangs off
// the netdev's own parent, as mlx5's and irdma's do off the PCI function,
// and one directory read resolves it; eth0's hangs off the PCI function
// above the netdev's virtio parent, which resolution finds by looking at
// every RDMA device's sysfs link.
func deviceCounts(rep *report, nics []rig.NIC) error {
	var counts []int
	for _, c := range intList(*devList) {
		if c < 2 || c > len(nics) {
			rep.note("curve 1: %d devices skipped, the VM has %d NICs and the curve needs 2", c, len(nics))
			continue
		}
		counts = append(counts, c)
	}
	if len(counts) == 0 {
		return nil
	}
	defer setDeviceCount(nics, len(nics))
	type series struct {
		nic           rig.NIC
		label, legend string
		pod           *rig.Pod
		times         map[int][]time.Duration
	}
	all := []*series{{nic: nics[1], label: "RDMA device under the netdev's parent (mlx5, irdma)", legend: "rdma-netns, device under netdev's parent"},
		{nic: nics[0], label: "RDMA device one level above it (virtio soft-RoCE)", legend: "rdma-netns, device one level up (virtio)"}}
	for _, se := range all {
		pod, err := rig.NewPod()
		if err != nil {
			return err
		}
		defer pod.Destroy()
		if err := rig.MoveNetdevIn(se.nic.Netdev, pod.Path()); err != nil {
			return err
		}
		defer rig.MoveNetdevOut(se.nic.Netdev, pod.Path())
		se.pod, se.times = pod, map[int][]time.Duration{}
	}
	pair := func(se *series) (time.Duration, error) {
		call := func(verb string) rig.Call {
			return rig.Call{Verb: verb, ContainerID: "devices-" + se.nic.Netdev, Netns: se.pod.Path(), IfName: se.nic.Netdev,
				Stdin: rig.PluginConf("bench-devices", se.nic.Netdev, se.pod.Path(), nil)}
		}
		a, err := execCNI(call("ADD"))
		if err != nil {
			return 0, err
		}
		d, err := execCNI(call("DEL"))
		return a + d, err
	}
	// The kernel's own move there and back (in-process, by index, no
	// lookup) is timed in the same turns: whatever of a growth is the
	// kernel's (ib_core re-registering the device among more of them)
	// shows in it, and the rest is rdma-netns's.
	kernel := map[int][]time.Duration{}
	for r := -1; r < *devRounds; r++ {
		for j := range counts {
			c := counts[(max(r, 0)+j)%len(counts)]
			if err := setDeviceCount(nics, c); err != nil {
				return err
			}
			for k := 0; k < 3; k++ {
				for _, se := range all {
					d, err := pair(se)
					if err != nil {
						return fmt.Errorf("curve 1, %d devices, %s: %v", c, se.nic.Netdev, err)
					}
					if r >= 0 { // round -1 warms up
						se.times[c] = append(se.times[c], d)
					}
				}
				in, out, err := kernelFloor(nics[1].RDMA, all[0].pod.Path(), 1)
				if err != nil {
					return fmt.Errorf("curve 1, %d devices, the kernel's move: %v", c, err)
				}
				if r >= 0 {
					kernel[c] = append(kernel[c], in[0]+out[0])
				}
			}
		}
	}
	first, last := counts[0], counts[len(counts)-1]
	median := func(m map[int][]time.Duration, c int) time.Duration { return rig.Summarize(m[c]).Median }
	var xs []float64
	for _, c := range counts {
		xs = append(xs, float64(c))
	}
	var lines []plot.Series
	for _, se := range all {
		var ys []float64
		for _, c := range counts {
			rep.add("devices on the node", fmt.Sprintf("%2d RDMA devices: ADD+DEL, %s", c, se.nic.Layout), rig.Summarize(se.times[c]),
				median(se.times, first), fmt.Sprintf("%d devices", first), fmt.Sprintf("per-round ratios %s", spread(se.times[c], se.times[first])))
			ys = append(ys, ms(median(se.times, c)))
		}
		r := float64(median(se.times, last)) / float64(median(se.times, first))
		own := float64(median(se.times, last)-median(kernel, last)) / float64(median(se.times, first)-median(kernel, first))
		rep.note("target ADD+DEL with %d devices <= 1.1x with %d, %s: %s (%.2fx; rdma-netns's own part, less the kernel's move, %.2fx)",
			last, first, se.label, verdict(r <= 1.1), r, own)
		lines = append(lines, plot.Series{Label: se.legend, Ys: ys})
	}
	var ks []float64
	for _, c := range counts {
		rep.add("devices on the node", fmt.Sprintf("%2d RDMA devices: the kernel's move in+out", c), rig.Summarize(kernel[c]),
			median(kernel, first), fmt.Sprintf("%d devices", first), "in-process, by index")
		ks = append(ks, ms(median(kernel, c)))
	}
	goal := make([]float64, len(xs))
	for i := range goal {
		goal[i] = 1.1 * ms(median(all[0].times, first))
	}
	lines = append(lines, plot.Series{Label: "kernel's move in+out, in-process", Ys: ks},
		plot.Series{Label: fmt.Sprintf("goal: 1.1x at %d devices (first line)", first), Ys: goal, Dashed: true})
	(&plot.Plot{Name: "curve1-devices-on-node", Title: "Curve 1: one ADD+DEL against the RDMA devices on the node",
		XLabel: "RDMA devices on the node", YLabel: "ms (median)", Xs: xs, Series: lines}).Emit()
	return nil
}

// setDeviceCount leaves the first c NICs with their rxe device and the
// others without, adding or deleting devices as the VM's init made them
// (scripts/vm-run.sh: the sysfs parent by layout).
func setDeviceCount(nics []rig.NIC, c int) error {
	have, err := rig.RDMAIn("")
	if err != nil {
		return err
	}
	for i, n := range nics {
		present := rig.Contains(have, n.RDMA)
		switch {
		case i < c && !present:
			level := "2"
			if n.Layout == "child" {
				level = "1"
			}
			if err := os.WriteFile("/sys/module/rdma_rxe/parameters/parent", []byte(level), 0o644); err != nil {
				return err
			}
			out, err := exec.Command("/usr/sbin/rdma", "link", "add", n.RDMA, "type", "rxe", "netdev", n.Netdev).CombinedOutput()
			os.WriteFile("/sys/module/rdma_rxe/parameters/parent", []byte("0"), 0o644)
			if err != nil {
				return fmt.Errorf("rdma link add %s: %v: %s", n.RDMA, err, out)
			}
		case i >= c && present:
			if out, err := exec.Command("/usr/sbin/rdma", "link", "delete", n.RDMA).CombinedOutput(); err != nil {
				return fmt.Errorf("rdma link delete %s: %v: %s", n.RDMA, err, out)
			}
		}
	}
	return nil
}
