package benchcluster

import (
	"math"
	"sort"
	"time"
)

// Sample is one pod's way through the scheduler as the bench saw it:
// from its create request to the first watch event with its node set.
type Sample struct {
	Created, Scheduled time.Time
	// Probe: created alone, nothing else in flight (Probes).
	Probe bool
}

// Latency is the pod's scheduling latency.
func (s Sample) Latency() time.Duration { return s.Scheduled.Sub(s.Created) }

// Summary is a window of pods: how many, how fast they went through
// (pods over the time from the first create to the last bind) and
// their latencies' percentiles.
type Summary struct {
	Pods     int
	Elapsed  time.Duration
	Rate     float64 // pods/s
	P50, P99 time.Duration
	// Probes is how many pods P50 and P99 are of, when they are a fill
	// state's probes rather than Pods.
	Probes int
}

// Summarize is the fill's throughput and latencies: the pods created in
// flight between the probes (empty to half full, half to nearly full),
// over the time from each run's start (the probes before it placed) to
// its last bind; their latencies include the queue of up to InFlight.
func Summarize(samples []Sample) Summary {
	c := len(samples)
	p := probeCount(c)
	var sum Summary
	var lat []time.Duration
	for _, run := range [][2]int{{p, c / 2}, {c/2 + p, c - p}} {
		a, b := max(run[0], 0), min(run[1], c)
		if a >= b {
			continue
		}
		var start, last time.Time
		for _, s := range samples[:a] {
			if s.Scheduled.After(start) {
				start = s.Scheduled
			}
		}
		for _, s := range samples[a:b] {
			if s.Probe || s.Scheduled.IsZero() {
				continue
			}
			sum.Pods++
			lat = append(lat, s.Latency())
			if start.IsZero() || s.Created.Before(start) {
				start = s.Created
			}
			if s.Scheduled.After(last) {
				last = s.Scheduled
			}
		}
		if last.After(start) {
			sum.Elapsed += last.Sub(start)
		}
	}
	if sum.Elapsed > 0 {
		sum.Rate = float64(sum.Pods) / sum.Elapsed.Seconds()
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sum.P50, sum.P99 = Percentile(lat, 50), Percentile(lat, 99)
	return sum
}

// Percentile is the nearest-rank p-th percentile of sorted durations:
// the smallest value with at least p % of the values at or below it, so
// a p99 of fewer than 100 values is their maximum, never an interpolation
// between two pods no one measured.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// probeCount is how many probes each fill state gets, and how many pods
// its throughput window holds: a tenth of the capacity, 1 to 20.
func probeCount(capacity int) int { return min(max(capacity/10, 1), 20) }

// Probes marks the pods created alone, each once every pod before it is
// placed, for latencies without queueing: the first ones (the cluster
// empty), as many from the half, and the last ones (nearly full, the
// very last taking the last place).
func Probes(capacity int) []bool {
	p := probeCount(capacity)
	out := make([]bool, capacity)
	for _, start := range []int{0, capacity / 2, capacity - p} {
		for i := max(start, 0); i < min(start+p, capacity); i++ {
			out[i] = true
		}
	}
	return out
}

// States sums the fill states up: each one's throughput from the pods
// created in flight next to its probes (after the first probes, after
// the half's, before the last ones: empty, half full, nearly full), its
// latencies from its probes.
func States(samples []Sample) (empty, half, full Summary) {
	c := len(samples)
	p := probeCount(c)
	state := func(probeAt, windowAt int) Summary {
		s := window(samples, windowAt, windowAt+p)
		var lat []time.Duration
		for _, x := range samples[max(probeAt, 0):min(probeAt+p, c)] {
			if x.Probe && !x.Scheduled.IsZero() {
				lat = append(lat, x.Latency())
			}
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		s.Probes, s.P50, s.P99 = len(lat), Percentile(lat, 50), Percentile(lat, 99)
		return s
	}
	return state(0, p), state(c/2, c/2+p), state(c-p, c-2*p)
}

// window is the throughput of the pods in [a, b) that are not probes:
// their count over the time from the moment the scheduler was done with
// the pods before them (the fill drains there: probes, or Drains) to the
// last one's bind.
func window(samples []Sample, a, b int) Summary {
	a, b = max(a, 0), min(b, len(samples))
	var start, last time.Time
	for _, s := range samples[:a] {
		if s.Scheduled.After(start) {
			start = s.Scheduled
		}
	}
	n := 0
	for _, s := range samples[a:max(a, b)] {
		if s.Probe || s.Scheduled.IsZero() {
			continue
		}
		n++
		if start.IsZero() || (a == 0 && s.Created.Before(start)) {
			start = s.Created
		}
		if s.Scheduled.After(last) {
			last = s.Scheduled
		}
	}
	sum := Summary{Pods: n}
	if n > 0 && last.After(start) {
		sum.Elapsed = last.Sub(start)
		sum.Rate = float64(n) / sum.Elapsed.Seconds()
	}
	return sum
}

// Drains are where the fill waits for every pod in flight before going
// on without a probe: before the nearly-full window, which follows no
// probes, so that window measures from an empty queue as the others do.
func Drains(capacity int) map[int]bool {
	return map[int]bool{capacity - 2*probeCount(capacity): true}
}

// Ratio is a/b, NaN when b is 0 (no control measured).
func Ratio(a, b float64) float64 {
	if b == 0 {
		return math.NaN()
	}
	return a / b
}
