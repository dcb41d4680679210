package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/rdma-netns/rdma-netns/e2e/internal/plot"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

var (
	scrapeRounds = flag.Int("scrape-rounds", 30, "scrapes of rdma-netns-exporter per measurement")
	scrapeTurns  = flag.Int("scrape-turns", 3, "curve 4: turns over the points (all on the host, then each number held), the scrapes of a point split among them")
	scrapeHeld   = flag.String("scrape-held", "8,28", "curve 4: numbers of devices held by pods, one each, for the exporter's scrape cost")
)

const benchExporterAddr = "127.0.0.1:9762"

// exporterScrape is curve 4: what one scrape of rdma-netns-exporter costs
// with every device on the host (no netns to enter), then with some held
// by pods, one each (one netns entered per pod). The points take turns
// (*scrapeTurns of them, each with its share of the scrapes), so drift over
// the run, which on a shared machine is wider than the difference
// measured, hits every point alike.
func exporterScrape(rep *report, nics []rig.NIC) error {
	// Each scrape is measured walking the node: no collection is shared
	// (--cache-max-age 0), and no API server reviews a token (--auth none).
	cmd := exec.Command("/usr/local/bin/rdma-netns-exporter", "--listen", benchExporterAddr, "--auth", "none", "--cache-max-age", "0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start exporter: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	base := "http://" + benchExporterAddr
	if err := waitHealthy(base); err != nil {
		return fmt.Errorf("%v: %s", err, stderr.String())
	}
	type point struct {
		held  int
		times []time.Duration
		note  string
	}
	var points []point
	for _, k := range intList(*scrapeHeld) {
		if k == 0 {
			continue
		}
		if k > len(nics) {
			rep.note("curve 4: %d devices held skipped, the VM has %d NICs", k, len(nics))
			continue
		}
		points = append(points, point{held: k})
	}
	turns := max(*scrapeTurns, 1)
	per := max(*scrapeRounds/turns, 1)
	var hostAll []time.Duration
	for range turns {
		ts, _, err := scrapes(base, len(nics), per)
		if err != nil {
			return fmt.Errorf("exporter, devices on the host: %v: %s", err, stderr.String())
		}
		hostAll = append(hostAll, ts...)
		for i := range points {
			ts, note, err := scrapesHeld(base, nics, points[i].held, per)
			if err != nil {
				return fmt.Errorf("%v: %s", err, stderr.String())
			}
			points[i].times, points[i].note = append(points[i].times, ts...), note
		}
	}
	host := rig.Summarize(hostAll)
	rep.add("exporter", fmt.Sprintf("scrape, %d devices, all on the host", len(nics)), host, 0, "", fmt.Sprintf("GET /metrics, parsed; %d turns with the rows below", turns))
	xs, ys, hs := []float64{0}, []float64{ms(host.Median)}, []float64{ms(host.Median)}
	worst := 0.0
	for _, p := range points {
		s := rig.Summarize(p.times)
		rep.add("exporter", fmt.Sprintf("scrape, %d devices, %d of them held by pods", len(nics), p.held), s, host.Median, "all on the host", p.note)
		xs, ys, hs = append(xs, float64(p.held)), append(ys, ms(s.Median)), append(hs, ms(host.Median))
		worst = max(worst, float64(s.Median)/float64(host.Median))
	}
	if len(points) > 0 {
		rep.note("target scrape with devices held by pods <= 1.3x the same devices on the host: %s (worst %.2fx)", verdict(worst <= 1.3), worst)
		goal := make([]float64, len(hs))
		for i := range goal {
			goal[i] = 1.3 * hs[i]
		}
		(&plot.Plot{Name: "curve4-exporter-scrape", Title: fmt.Sprintf("Curve 4: exporter scrape, %d devices on the node", len(nics)),
			XLabel: "devices held by pods (one each)", YLabel: "ms per scrape (median)", Xs: xs,
			Series: []plot.Series{{Label: "scrape", Ys: ys}, {Label: "all devices on the host", Ys: hs, Dashed: true}, {Label: "goal: 1.3x that", Ys: goal, Dashed: true}}}).Emit()
	}
	return nil
}

// scrapesHeld attaches the first k NICs to k pods through the chain, with
// pod names for the exporter's labels, scrapes, and detaches them.
func scrapesHeld(base string, nics []rig.NIC, k, n int) ([]time.Duration, string, error) {
	pods := make([]*rig.Pod, k)
	for i := range pods {
		var err error
		if pods[i], err = rig.NewPod(); err != nil {
			return nil, "", err
		}
	}
	defer func() {
		for _, p := range pods {
			p.Destroy()
		}
		rig.WaitHome(nics, 5*time.Second)
	}()
	cache, err := os.MkdirTemp("", "bench-exporter")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(cache)
	c := rig.CNI(cache)
	var attached []func() error
	defer func() {
		for _, del := range attached {
			del()
		}
	}()
	for i, nic := range nics[:k] {
		l, err := rig.Chain("bench-exporter", nic.Netdev, 100+i, map[string]any{})
		if err != nil {
			return nil, "", err
		}
		rt := rig.RT(fmt.Sprintf("exporter-%d", i), pods[i].Path(), "net1")
		rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "bench"}, {"K8S_POD_NAME", fmt.Sprintf("worker-%d", i)}}
		if err := rig.AddChain(c, l, rt); err != nil {
			return nil, "", fmt.Errorf("exporter bench: ADD %s: %v", nic.Netdev, err)
		}
		attached = append(attached, func() error { return rig.DelChain(c, l, rt) })
	}
	times, body, err := scrapes(base, len(nics), n)
	if err != nil {
		return nil, "", fmt.Errorf("exporter, %d devices in pods: %v", k, err)
	}
	if got := strings.Count(body, `pod="worker-`); got == 0 {
		return nil, "", fmt.Errorf("exporter: no sample names a pod:\n%s", body)
	}
	note := fmt.Sprintf("%d samples, %d bytes; %s", strings.Count(body, "\nrdma_"), len(body), selfMetrics(body))
	for len(attached) > 0 {
		last := attached[len(attached)-1]
		attached = attached[:len(attached)-1]
		if err := last(); err != nil {
			return nil, "", fmt.Errorf("exporter bench: DEL: %v", err)
		}
	}
	return times, note, nil
}

func waitHealthy(base string) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("exporter did not answer /healthz")
}

// scrapes times n scrapes and checks each reports every device.
func scrapes(base string, devices, n int) ([]time.Duration, string, error) {
	var times []time.Duration
	var body string
	for range n {
		t0 := time.Now()
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return nil, "", err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		times = append(times, time.Since(t0))
		if err != nil {
			return nil, "", err
		}
		body = string(b)
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			return nil, "", fmt.Errorf("invalid exposition format: %v", err)
		}
		if got := fams["rdma_exporter_devices"].GetMetric()[0].GetGauge().GetValue(); int(got) != devices {
			return nil, "", fmt.Errorf("scrape reported %v devices, want %d", got, devices)
		}
	}
	return times, body, nil
}

// selfMetrics picks the exporter's own figures from a scrape.
func selfMetrics(body string) string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		for _, name := range []string{"rdma_exporter_scrape_duration_seconds ", "go_threads ", "process_resident_memory_bytes "} {
			if strings.HasPrefix(line, name) {
				out = append(out, line)
			}
		}
	}
	return strings.Join(out, ", ")
}
