//go:build e2e

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

const exporterAddr = "127.0.0.1:9761"

// startExporter runs rdma-netns-exporter on the node, as the DaemonSet's
// second container does, and waits for /healthz. There is no cluster here
// to review tokens (--auth none; e2e/k8s scrapes the DaemonSet's with
// one), and each scrape must see the node as it is after the step before
// it (--cache-max-age 0).
func startExporter(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("/usr/local/bin/rdma-netns-exporter", "--listen", exporterAddr, "--state-dir", stateDir, "--auth", "none", "--cache-max-age", "0")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start exporter: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		t.Logf("exporter stderr:\n%s", stderr.String())
	})
	base := "http://" + exporterAddr
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("exporter exited: %v\n%s", err, stderr.String())
		default:
		}
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return base
			}
		}
	}
	t.Fatalf("exporter did not answer /healthz: %s", stderr.String())
	return ""
}

// scrapeMetrics GETs /metrics and parses it strictly as Prometheus text
// exposition format.
func scrapeMetrics(t *testing.T, base string) (map[string]*dto.MetricFamily, string) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics is not valid exposition format: %v\n%s", err, body)
	}
	return fams, string(body)
}

// samples returns the samples of family name whose labels include want.
func samples(fams map[string]*dto.MetricFamily, name string, want map[string]string) []*dto.Metric {
	var out []*dto.Metric
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, lp := range m.GetLabel() {
			have[lp.GetName()] = lp.GetValue()
		}
		match := true
		for k, v := range want {
			if have[k] != v {
				match = false
			}
		}
		if match {
			out = append(out, m)
		}
	}
	return out
}

// hwCounter is the one rdma_port_hw_stat_total sample of a device's
// port 1 with the given labels.
func hwCounter(t *testing.T, fams map[string]*dto.MetricFamily, labels map[string]string, counter string) float64 {
	t.Helper()
	want := map[string]string{"port": "1", "counter": counter}
	for k, v := range labels {
		want[k] = v
	}
	got := samples(fams, "rdma_port_hw_stat_total", want)
	if len(got) != 1 {
		t.Fatalf("%d samples rdma_port_hw_stat_total%v, want 1", len(got), want)
	}
	return got[0].GetCounter().GetValue()
}

func k8sArgs(namespace, pod string) [][2]string {
	return [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", pod}}
}

// The exporter, started on the node, reports every device wherever it is,
// labelled with the pod (from the runtime's CNI_ARGS) that holds it;
// after DEL the device reports from the host with no pod.
func TestExporterLabelsDevicesWithTheirPod(t *testing.T) {
	requireMode(t, "exclusive")
	base := startExporter(t)
	a, b := nicBy(t, "pf"), nicBy(t, "child")
	c := cni(t)
	la := chain(t, "rdma-exp-a", a.Netdev, 80, nil)
	lb := chain(t, "rdma-exp-b", b.Netdev, 81, map[string]any{"rdmaDevName": "rdma_net1"})
	pa, pb := newPod(t, "exp-a"), newPod(t, "exp-b")
	rta, rtb := pa.rt("net1"), pb.rt("net1")
	rta.Args, rtb.Args = k8sArgs("team-a", "trainer-0"), k8sArgs("team-b", "trainer-1")
	mustAdd(t, c, la, rta)
	mustAdd(t, c, lb, rtb)

	fams, body := scrapeMetrics(t, base)
	podA := map[string]string{"device": a.RDMA, "host_device": a.RDMA, "netdev": "net1", "namespace": "team-a", "pod": "trainer-0"}
	podB := map[string]string{"device": "rdma_net1", "host_device": b.RDMA, "netdev": "net1", "namespace": "team-b", "pod": "trainer-1"}
	for _, l := range []map[string]string{podA, podB} {
		if got := samples(fams, "rdma_port_state", l); len(got) != 1 || got[0].GetGauge().GetValue() != 4 {
			t.Errorf("rdma_port_state%v: %d samples, want one reading 4 (ACTIVE)\n%s", l, len(got), grepLines(body, l["device"]))
		}
		hwCounter(t, fams, l, "sent_pkts")
		if got := samples(fams, "rdma_device_resources", map[string]string{"device": l["device"], "pod": l["pod"], "resource": "qp"}); len(got) != 1 {
			t.Errorf("no rdma_device_resources qp sample for %s", l["device"])
		}
	}
	// The devices left on the host carry no pod.
	for _, n := range nics {
		if n.RDMA == a.RDMA || n.RDMA == b.RDMA {
			continue
		}
		host := map[string]string{"device": n.RDMA, "netdev": n.Netdev, "namespace": "", "pod": ""}
		hwCounter(t, fams, host, "sent_pkts")
	}

	sentA, rcvdB := hwCounter(t, fams, podA, "sent_pkts"), hwCounter(t, fams, podB, "rcvd_pkts")
	pkts := rdmaTraffic(t, pa, pb, a.RDMA, "rdma_net1", 80)
	fams, body = scrapeMetrics(t, base)
	dSent, dRcvd := hwCounter(t, fams, podA, "sent_pkts")-sentA, hwCounter(t, fams, podB, "rcvd_pkts")-rcvdB
	t.Logf("after %d messages each way: pod A's sent_pkts +%v, pod B's rcvd_pkts +%v", pkts, dSent, dRcvd)
	if dSent < float64(pkts) {
		t.Errorf("pod A's sent_pkts grew by %v, want at least the %d messages it sent", dSent, pkts)
	}
	if dRcvd < float64(pkts) {
		t.Errorf("pod B's rcvd_pkts grew by %v, want at least the %d messages A sent", dRcvd, pkts)
	}
	t.Logf("/metrics for the pods' devices after the traffic (excerpt):\n%s", grepLines(grepLines(body, "trainer-"), "_pkts", "rdma_sends", "rdma_recvs", "rdma_port_state", `resource="qp"`))

	mustDel(t, c, la, rta)
	fams, body = scrapeMetrics(t, base)
	if got := samples(fams, "rdma_port_hw_stat_total", map[string]string{"pod": "trainer-0"}); len(got) != 0 {
		t.Errorf("after DEL %d samples still name pod trainer-0", len(got))
	}
	home := map[string]string{"device": a.RDMA, "host_device": a.RDMA, "netdev": a.Netdev, "namespace": "", "pod": ""}
	hwCounter(t, fams, home, "sent_pkts")
	t.Logf("/metrics for %s after DEL:\n%s", a.RDMA, grepLines(body, `device="`+a.RDMA+`"`))
	mustDel(t, c, lb, rtb)
}

// Many concurrent scrapes leave the exporter with the goroutines it
// started with and no more OS threads than a burst of them needs: every
// netns is entered on a thread that is thrown away afterwards. Go keeps
// idle threads for later (go_threads counts them), so the first burst may
// leave a few, one per scrape at once and the runtime's own; a second
// burst must find them and create none to keep (a thread kept per netns
// entered, the leak this guards against, adds one per scrape).
func TestExporterConcurrentScrapesLeakNothing(t *testing.T) {
	requireMode(t, "exclusive")
	base := startExporter(t)
	n := nicBy(t, "pf")
	c := cni(t)
	l := chain(t, "rdma-exp-leak", n.Netdev, 82, nil)
	p := newPod(t, "exp-leak")
	rt := p.rt("net1")
	rt.Args = k8sArgs("team-a", "leak-0")
	mustAdd(t, c, l, rt)
	defer mustDel(t, c, l, rt)

	const scrapes, parallel = 60, 4
	threads0, goroutines0 := exporterThreads(t, base)
	burst := func() (threads, goroutines float64) {
		var wg sync.WaitGroup
		errs := make(chan error, scrapes)
		for w := range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range scrapes / parallel {
					resp, err := http.Get(base + "/metrics")
					if err != nil {
						errs <- err
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `pod="leak-0"`) {
						errs <- fmt.Errorf("scraper %d: %s without the pod's device", w, resp.Status)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		// Threads thrown away leave the count a moment later.
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			threads, goroutines = exporterThreads(t, base)
			if threads <= threads0+2*parallel && goroutines <= goroutines0+4 || time.Now().After(deadline) {
				return threads, goroutines
			}
		}
	}
	threads1, goroutines1 := burst()
	threads2, goroutines2 := burst()
	t.Logf("two bursts of %d scrapes, %d at a time: go_threads %v -> %v -> %v, go_goroutines %v -> %v -> %v",
		scrapes, parallel, threads0, threads1, threads2, goroutines0, goroutines1, goroutines2)
	if threads1 > threads0+2*parallel || goroutines1 > goroutines0+4 {
		t.Errorf("the exporter leaks: after %d scrapes go_threads %v -> %v, go_goroutines %v -> %v", scrapes, threads0, threads1, goroutines0, goroutines1)
	}
	if threads2 > threads1+2 || goroutines2 > goroutines0+4 {
		t.Errorf("the exporter leaks: a second burst of %d scrapes took go_threads %v -> %v, go_goroutines %v -> %v", scrapes, threads1, threads2, goroutines1, goroutines2)
	}
}

// exporterThreads is the exporter's go_threads and go_goroutines.
func exporterThreads(t *testing.T, base string) (threads, goroutines float64) {
	t.Helper()
	fams, _ := scrapeMetrics(t, base)
	gauge := func(name string) float64 { return fams[name].GetMetric()[0].GetGauge().GetValue() }
	return gauge("go_threads"), gauge("go_goroutines")
}

// rdmaTraffic runs ibv_rc_pingpong between the two pods' devices (a's
// pod serves, b's connects to it over the static addresses of chain) and
// returns how many messages each side sent. Both processes have exited
// when it returns, as kubelet kills a pod's processes before DEL.
func rdmaTraffic(t *testing.T, a, b *pod, devA, devB string, addrA int) int {
	t.Helper()
	const iters = 50
	n := fmt.Sprint(iters)
	server := exec.Command("ibv_rc_pingpong", "-d", devA, "-g", "1", "-n", n)
	var serverOut bytes.Buffer
	server.Stdout, server.Stderr = &serverOut, &serverOut
	// A child forked from a thread inside the netns starts in it.
	if err := ns.WithNetNSPath(a.path(), func(ns.NetNS) error { return server.Start() }); err != nil {
		t.Fatalf("start ibv_rc_pingpong server: %v", err)
	}
	serverDone := make(chan error, 1)
	go func() { serverDone <- server.Wait() }()
	ip := fmt.Sprintf("10.100.%d.%d", addrA/200, addrA%200+2)
	var clientOut []byte
	var err error
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		clientOut, err = inNetns(b.path(), "ibv_rc_pingpong", "-d", devB, "-g", "1", "-n", n, ip)
		// Until the server listens, the client fails to connect and retries.
		if err == nil || time.Now().After(deadline) || !strings.Contains(string(clientOut), "Couldn't connect") {
			break
		}
	}
	if err != nil {
		server.Process.Kill()
		<-serverDone
		t.Fatalf("ibv_rc_pingpong client in pod %s: %v\nserver: %s", b.id, err, serverOut.String())
	}
	select {
	case err := <-serverDone:
		if err != nil {
			t.Fatalf("ibv_rc_pingpong server in pod %s: %v: %s", a.id, err, serverOut.String())
		}
	case <-time.After(60 * time.Second):
		server.Process.Kill()
		<-serverDone
		t.Fatalf("ibv_rc_pingpong server did not finish: %s", serverOut.String())
	}
	t.Logf("ibv_rc_pingpong %s -> %s: %s", devB, devA, strings.TrimSpace(string(clientOut)))
	return iters
}

// grepLines keeps the sample lines of body that contain any of substrs.
func grepLines(body string, substrs ...string) string {
	var out []string
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, s := range substrs {
			if strings.Contains(line, s) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}
