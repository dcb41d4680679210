package benchcluster

import (
	"math"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 10; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{50, 5 * time.Millisecond}, {99, 10 * time.Millisecond}, {10, time.Millisecond}, {0, time.Millisecond}, {100, 10 * time.Millisecond}} {
		if got := Percentile(d, c.p); got != c.want {
			t.Errorf("p%v of 1..10 ms = %v, want %v (nearest rank)", c.p, got, c.want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("p50 of nothing is not 0")
	}
}

// The fill's throughput is the pods in flight between the probe blocks
// over the runs' time, each run from the moment the probes before it
// were placed.
func TestSummarize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const c = 20
	s := make([]Sample, c)
	probe := Probes(c)
	clock := 0 * time.Millisecond
	for i := range s {
		s[i].Probe = probe[i]
		if probe[i] {
			// 1 s alone: not in the fill's rate.
			s[i].Created, s[i].Scheduled = t0.Add(clock), t0.Add(clock+time.Second)
			clock += time.Second
			continue
		}
		s[i].Created, s[i].Scheduled = t0.Add(clock), t0.Add(clock+200*time.Millisecond)
		clock += 100 * time.Millisecond
	}
	got := Summarize(s)
	// Runs 2-9 (8 pods) and 12-17 (6 pods), 100 ms apart each, the
	// first bind 200 ms after the run's start: 14 pods in 0.9 + 0.7 s.
	if got.Pods != 14 || math.Abs(got.Rate-14/1.6) > 1e-9 || got.P50 != 200*time.Millisecond || got.P99 != 200*time.Millisecond {
		t.Errorf("Summarize = %+v, want 14 pods at %.2f/s, latencies 200ms", got, 14/1.6)
	}
	if z := Summarize(nil); z.Pods != 0 || z.Rate != 0 {
		t.Errorf("Summarize(nil) = %+v", z)
	}
}

// The probes are the first, middle and last tenth of the pods (20 at
// most), the very last pod among them: it takes the last place.
func TestProbes(t *testing.T) {
	p := Probes(200)
	var at []int
	for i, x := range p {
		if x {
			at = append(at, i)
		}
	}
	if len(at) != 60 || at[0] != 0 || at[19] != 19 || at[20] != 100 || at[40] != 180 || at[59] != 199 {
		t.Errorf("probes of 200 at %v, want 0-19, 100-119, 180-199", at)
	}
	if p := Probes(10); !p[0] || !p[5] || !p[9] || p[1] || p[8] {
		t.Errorf("probes of 10: %v, want 0, 5 and 9", p)
	}
}

// A state's throughput is its in-flight pods over the time since the
// pods before them were placed (not since their creates, which a full
// queue makes early), its latencies are its probes'.
func TestStates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const c = 20 // 2 probes a state, windows of 2
	s := make([]Sample, c)
	probe := Probes(c)
	clock := 0
	for i := range s {
		s[i].Probe = probe[i]
		if probe[i] {
			s[i].Created, s[i].Scheduled = at(clock), at(clock+10*(i+1))
			clock += 10 * (i + 1)
			continue
		}
		// In flight: created long before, placed 100 ms apart.
		s[i].Created, s[i].Scheduled = at(0), at(clock+100)
		clock += 100
	}
	empty, half, full := States(s)
	for _, c := range []struct {
		name     string
		got      Summary
		p50, p99 time.Duration
	}{{"empty", empty, 10 * time.Millisecond, 20 * time.Millisecond}, {"half", half, 110 * time.Millisecond, 120 * time.Millisecond}, {"full", full, 190 * time.Millisecond, 200 * time.Millisecond}} {
		if c.got.Pods != 2 || math.Abs(c.got.Rate-10) > 1e-9 || c.got.Probes != 2 || c.got.P50 != c.p50 || c.got.P99 != c.p99 {
			t.Errorf("%s: %+v, want 2 pods at 10/s, probes p50 %v p99 %v", c.name, c.got, c.p50, c.p99)
		}
	}
	if !math.IsNaN(Ratio(1, 0)) || Ratio(1, 2) != 0.5 {
		t.Error("Ratio")
	}
}
