package benchcluster

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rdma-netns/rdma-netns/e2e/internal/plot"
)

// states are a result's windows, as the table names them.
func states(r Result) []struct {
	name string
	s    Summary
} {
	return []struct {
		name string
		s    Summary
	}{{"fill", r.Fill}, {"empty", r.Empty}, {"half", r.Half}, {"nearly full", r.Full}}
}

// control is the GPU-only control's result at r's size.
func control(results []Result, nodes int) *Result {
	for i := range results {
		if results[i].Nodes == nodes && results[i].Template.Control {
			return &results[i]
		}
	}
	return nil
}

func msf(d time.Duration) string { return fmt.Sprintf("%.0f", float64(d.Microseconds())/1000) }

func ratio(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// WriteTables prints the scheduling, refusal and driver tables.
func WriteTables(w io.Writer, results []Result, drivers []DriverResult) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\ttemplate\tstate\tpods\tpods/s\tx control\tp50 ms\tp99 ms\tlatency of\t")
	for _, r := range results {
		c := control(results, r.Nodes)
		for i, st := range states(r) {
			x := math.NaN()
			if c != nil {
				x = Ratio(st.s.Rate, states(*c)[i].s.Rate)
			}
			of := "all, queued"
			if i > 0 {
				of = fmt.Sprintf("%d probes", st.s.Probes)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%.1f\t%s\t%s\t%s\t%s\t\n", r.Nodes, r.Template.Name, st.name, st.s.Pods, st.s.Rate, ratio(x), msf(st.s.P50), msf(st.s.P99), of)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\ttemplate\tunplaceable refused ms\tplain pod after ms\tscheduler CPU s\tCPU ms/pod\tx control\t")
	for _, r := range results {
		per := func(r Result) float64 {
			return float64(r.SchedulerCPU.Milliseconds()) / math.Max(float64(r.Fill.Pods), 1)
		}
		x := math.NaN()
		if c := control(results, r.Nodes); c != nil {
			x = Ratio(per(r), per(*c))
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%.1f\t%.1f\t%s\t\n", r.Nodes, r.Template.Name, msf(r.Refused), msf(r.PlainAfter), r.SchedulerCPU.Seconds(), per(r), ratio(x))
	}
	tw.Flush()
	if len(drivers) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "nodes\tphase\ttook s\trequests\twrites\tbytes\twatch events\tper\topen watches\tby verb\t")
	for _, d := range drivers {
		n := float64(d.Nodes)
		row := func(phase string, t Traffic, took time.Duration, div float64, per string) {
			fmt.Fprintf(tw, "%d\t%s\t%.1f\t%.2f\t%.2f\t%.0f\t%.1f\t%s\t%.0f\t%s\t\n", d.Nodes, phase, took.Seconds(),
				t.Total()/div, t.Writes()/div, (t.ResponseBytes+t.WatchBytes)/div, t.WatchEvents/div, per, t.Watches, verbs(t))
		}
		row("first publish", d.FirstPublish, d.FirstPublishTime, n, "node")
		row(fmt.Sprintf("steady %v", d.Window.Round(time.Second)), d.Steady, d.Window, n*d.Window.Hours(), "node-hour")
		row("one NIC unplugged", d.Unplug, d.UnplugTime, 1, "change")
		row("one NIC plugged back", d.Replug, d.ReplugTime, 1, "change")
	}
	tw.Flush()
}

// verbs is a traffic's requests by verb, as the API server counts them.
func verbs(t Traffic) string {
	var vs []string
	for v, n := range t.Requests {
		if n != 0 {
			vs = append(vs, fmt.Sprintf("%s %.0f", v, n))
		}
	}
	sort.Strings(vs)
	if len(vs) == 0 {
		return "none"
	}
	return strings.Join(vs, ", ")
}

// Plots are throughput against N per template (the whole fill), and
// each template's ratio to the control at each N.
func Plots(results []Result, sizes []int) []*plot.Plot {
	xs := make([]float64, len(sizes))
	for i, n := range sizes {
		xs[i] = float64(n)
	}
	var names []string
	seen := map[string]bool{}
	for _, r := range results {
		if !seen[r.Template.Name] {
			seen[r.Template.Name] = true
			names = append(names, r.Template.Name)
		}
	}
	rate := &plot.Plot{Name: "bench-cluster-throughput", Title: "Pods scheduled per second, empty to full, against nodes",
		XLabel: "nodes (8 GPUs, 8 NICs each)", YLabel: "pods/s", Xs: xs}
	rel := &plot.Plot{Name: "bench-cluster-ratio", Title: "Throughput as a ratio to the GPU-only control, same run",
		XLabel: "nodes (8 GPUs, 8 NICs each)", YLabel: "x GPU-only control", Xs: xs}
	for _, name := range names {
		ys, rs := make([]float64, len(sizes)), make([]float64, len(sizes))
		for i, n := range sizes {
			ys[i], rs[i] = math.NaN(), math.NaN()
			for _, r := range results {
				if r.Nodes == n && r.Template.Name == name {
					ys[i] = r.Fill.Rate
					if c := control(results, n); c != nil {
						rs[i] = Ratio(r.Fill.Rate, c.Fill.Rate)
					}
				}
			}
		}
		rate.Series = append(rate.Series, plot.Series{Label: name, Ys: ys})
		rel.Series = append(rel.Series, plot.Series{Label: name, Ys: rs})
	}
	goal := make([]float64, len(sizes))
	for i := range goal {
		goal[i] = 0.5
	}
	rel.Series = append(rel.Series, plot.Series{Label: "goal: pairs at 0.5x at 1,000 nodes", Ys: goal, Dashed: true})
	return []*plot.Plot{rate, rel}
}
