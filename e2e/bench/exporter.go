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

	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

var (
	scrapeRounds = flag.Int("scrape-rounds", 30, "scrapes of rdma-netns-exporter per measurement")
	scrapePods   = flag.Int("scrape-pods", 16, "pods holding one device each for the exporter's scrape cost")
)

const benchExporterAddr = "127.0.0.1:9762"

// exporterScrape measures what one scrape of rdma-netns-exporter costs with
// every device on the host (no netns to enter), then with scrapePods
// devices each in a pod of its own (one netns entered, with a private
// sysfs mounted, per pod).
func exporterScrape(rep *report, nics []rig.NIC) error {
	n := min(*scrapePods, len(nics))
	if n < *scrapePods {
		rep.note("exporter: %d pods instead of %d: the VM has %d NICs", n, *scrapePods, len(nics))
	}
	cmd := exec.Command("/usr/local/bin/rdma-netns-exporter", "--listen", benchExporterAddr)
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

	hostOnly, _, err := scrapes(base, len(nics))
	if err != nil {
		return fmt.Errorf("exporter, devices on the host: %v: %s", err, stderr.String())
	}
	rep.add("exporter", fmt.Sprintf("scrape, %d devices on the host", len(nics)), hostOnly, 0, "", "GET /metrics, parsed")

	pods := make([]*rig.Pod, n)
	for i := range pods {
		if pods[i], err = rig.NewPod(); err != nil {
			return err
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
		return err
	}
	defer os.RemoveAll(cache)
	c := rig.CNI(cache)
	type attachment struct {
		del func() error
	}
	var attached []attachment
	defer func() {
		for _, a := range attached {
			a.del()
		}
	}()
	for i, nic := range nics[:n] {
		l, err := rig.Chain("bench-exporter", nic.Netdev, 100+i, map[string]any{})
		if err != nil {
			return err
		}
		rt := rig.RT(fmt.Sprintf("exporter-%d", i), pods[i].Path(), "net1")
		rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "bench"}, {"K8S_POD_NAME", fmt.Sprintf("worker-%d", i)}}
		if err := rig.AddChain(c, l, rt); err != nil {
			return fmt.Errorf("exporter bench: ADD %s: %v", nic.Netdev, err)
		}
		attached = append(attached, attachment{del: func() error { return rig.DelChain(c, l, rt) }})
	}
	inPods, body, err := scrapes(base, len(nics))
	if err != nil {
		return fmt.Errorf("exporter, %d devices in pods: %v: %s", n, err, stderr.String())
	}
	if got := strings.Count(body, `pod="worker-`); got == 0 {
		return fmt.Errorf("exporter: no sample names a pod:\n%s", body)
	}
	rep.add("exporter", fmt.Sprintf("scrape, %d devices in %d pods", n, n), inPods, hostOnly.Median, "host only",
		fmt.Sprintf("%d samples, %d bytes; %s", strings.Count(body, "\nrdma_"), len(body), selfMetrics(body)))
	for len(attached) > 0 {
		last := attached[len(attached)-1]
		attached = attached[:len(attached)-1]
		if err := last.del(); err != nil {
			return fmt.Errorf("exporter bench: DEL: %v", err)
		}
	}
	return nil
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

// scrapes times *scrapeRounds scrapes and checks each reports every device.
func scrapes(base string, devices int) (rig.Stats, string, error) {
	var times []time.Duration
	var body string
	for range *scrapeRounds {
		t0 := time.Now()
		resp, err := http.Get(base + "/metrics")
		if err != nil {
			return rig.Stats{}, "", err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		times = append(times, time.Since(t0))
		if err != nil {
			return rig.Stats{}, "", err
		}
		body = string(b)
		p := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			return rig.Stats{}, "", fmt.Errorf("invalid exposition format: %v", err)
		}
		if got := fams["rdma_exporter_devices"].GetMetric()[0].GetGauge().GetValue(); int(got) != devices {
			return rig.Stats{}, "", fmt.Errorf("scrape reported %v devices, want %d", got, devices)
		}
	}
	return rig.Summarize(times), body, nil
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
