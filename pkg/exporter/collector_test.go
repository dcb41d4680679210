package exporter

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/rdma-netns/rdma-netns/pkg/inventory"
	"github.com/rdma-netns/rdma-netns/pkg/state"
)

// fakeInventory finds fixed network namespaces and records.
type fakeInventory struct {
	targets *Targets
	err     error
}

func (f fakeInventory) Targets() (*Targets, error) { return f.targets, f.err }

// nodeWith is a node with the network namespaces at paths (besides the
// exporter's own) and recs; each path opens a netns of its own.
func nodeWith(paths []string, recs ...*state.Record) fakeInventory {
	ids := map[string]inventory.NetnsID{}
	t := &Targets{Self: inventory.NetnsID{Dev: 4, Ino: 1}, Records: recs}
	for i, p := range paths {
		ids[p] = inventory.NetnsID{Dev: 4, Ino: uint64(100 + i)}
		t.Namespaces = append(t.Namespaces, &inventory.Namespace{Path: p, ID: ids[p], Devices: []string{}})
	}
	t.Identify = func(p string) (inventory.NetnsID, error) {
		if id, ok := ids[p]; ok {
			return id, nil
		}
		return inventory.NetnsID{}, fmt.Errorf("%s: no such netns", p)
	}
	return fakeInventory{targets: t}
}

// fakeReader serves stats per netns; a netns in fail errors.
type fakeReader struct {
	devices map[string]map[string]DeviceStats // netns -> device -> stats
	fail    map[string]error
	// inFlight and maxInFlight count concurrent reads.
	inFlight, maxInFlight atomic.Int32
	// reads counts the reads of each netns.
	mu    sync.Mutex
	reads map[string]int
}

func (f *fakeReader) Read(nsPath string) ([]DeviceStats, error) {
	n := f.inFlight.Add(1)
	defer f.inFlight.Add(-1)
	for {
		m := f.maxInFlight.Load()
		if n <= m || f.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	f.mu.Lock()
	if f.reads == nil {
		f.reads = map[string]int{}
	}
	f.reads[nsPath]++
	f.mu.Unlock()
	if err := f.fail[nsPath]; err != nil {
		return nil, err
	}
	var out []DeviceStats
	for _, name := range slices.Sorted(maps.Keys(f.devices[nsPath])) {
		out = append(out, f.devices[nsPath][name])
	}
	return out, nil
}

func rxeStats(name, netdev string, sent, rcvd uint64) DeviceStats {
	return DeviceStats{
		Name:      name,
		Resources: map[string]uint64{"qp": 3, "cq": 2, "mr": 1, "pd": 1},
		Ports: []PortStats{{
			Port: 1, Netdev: netdev, State: 4, PhysState: 5,
			HWCounters: map[string]uint64{"sent_pkts": sent, "rcvd_pkts": rcvd},
		}},
	}
}

// scrape serves the collector over HTTP and parses the answer with
// prometheus/common's text parser, failing on anything that is not valid
// exposition format.
func scrape(t *testing.T, c *Collector) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(Handler(c, nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /metrics: %s\n%s", resp.Status, body)
	}
	fams, err := ParseText(resp.Body)
	if err != nil {
		t.Fatalf("/metrics is not valid exposition format: %v", err)
	}
	return fams
}

// ParseText is the strict parser the e2e test uses too (legacy metric and
// label names, as every Prometheus version accepts).
func ParseText(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	return p.TextToMetricFamilies(r)
}

// sample finds the one sample of family name whose labels include want.
func sample(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) (*dto.Metric, bool) {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		return nil, false
	}
	var found []*dto.Metric
	for _, m := range f.Metric {
		if hasLabels(m, want) {
			found = append(found, m)
		}
	}
	if len(found) > 1 {
		t.Fatalf("%s%v matches %d samples, want one", name, want, len(found))
	}
	if len(found) == 0 {
		return nil, false
	}
	return found[0], true
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, lp := range m.Label {
		have[lp.GetName()] = lp.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	m, ok := sample(t, fams, name, want)
	if !ok {
		t.Fatalf("no sample %s%v", name, want)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	t.Fatalf("%s%v is neither counter nor gauge", name, want)
	return 0
}

func TestHostDeviceCountersAndLabels(t *testing.T) {
	r := &fakeReader{devices: map[string]map[string]DeviceStats{"": {"rxe0": rxeStats("rxe0", "eth0", 10, 20)}}}
	c := NewCollector(nodeWith(nil), r)
	fams := scrape(t, c)

	host := map[string]string{"device": "rxe0", "port": "1", "netdev": "eth0", "namespace": "", "pod": "", "host_device": "rxe0"}
	if got := value(t, fams, "rdma_port_hw_stat_total", with(host, "counter", "sent_pkts")); got != 10 {
		t.Errorf("sent_pkts = %v, want 10", got)
	}
	if got := value(t, fams, "rdma_port_hw_stat_total", with(host, "counter", "rcvd_pkts")); got != 20 {
		t.Errorf("rcvd_pkts = %v, want 20", got)
	}
	if typ := fams["rdma_port_hw_stat_total"].GetType(); typ != dto.MetricType_COUNTER {
		t.Errorf("rdma_port_hw_stat_total is a %v, want a counter", typ)
	}
	if got := value(t, fams, "rdma_port_state", host); got != 4 {
		t.Errorf("port state = %v, want 4 (ACTIVE)", got)
	}
	if got := value(t, fams, "rdma_port_phys_state", host); got != 5 {
		t.Errorf("phys state = %v, want 5 (LinkUp)", got)
	}
	dev := map[string]string{"device": "rxe0", "namespace": "", "pod": "", "host_device": "rxe0"}
	if got := value(t, fams, "rdma_device_resources", with(dev, "resource", "qp")); got != 3 {
		t.Errorf("qp = %v, want 3", got)
	}
	if got := value(t, fams, "rdma_exporter_devices", nil); got != 1 {
		t.Errorf("rdma_exporter_devices = %v, want 1", got)
	}
	if got := value(t, fams, "rdma_exporter_read_errors", nil); got != 0 {
		t.Errorf("rdma_exporter_read_errors = %v, want 0", got)
	}
	if _, ok := fams["rdma_port_stat_total"]; ok {
		t.Errorf("rdma_port_stat_total present for a device without standard port counters")
	}
}

func with(m map[string]string, k, v string) map[string]string {
	out := map[string]string{k: v}
	for a, b := range m {
		out[a] = b
	}
	return out
}

// A netns that vanished (the pod died mid-scrape) costs only its devices,
// quietly; a netns that still exists but cannot be read is counted as an
// error; a netns without RDMA devices is no device.
func TestVanishingNetnsIsSkipped(t *testing.T) {
	r := &fakeReader{
		devices: map[string]map[string]DeviceStats{
			"":                {"rxe0": rxeStats("rxe0", "eth0", 1, 1)},
			"/run/netns/ok":   {"rxe2": rxeStats("rxe2", "net1", 5, 6)},
			"/run/netns/gone": {"rxe4": rxeStats("rxe4", "net1", 7, 8)},
			"/run/netns/bad":  {"rxe6": rxeStats("rxe6", "net1", 7, 8)},
		},
		fail: map[string]error{
			"/run/netns/gone": errors.New("open /run/netns/gone: no such file or directory"),
			"/run/netns/bad":  errors.New("mount sysfs for netns /run/netns/bad: operation not permitted"),
		},
	}
	c := NewCollector(nodeWith([]string{"/run/netns/ok", "/run/netns/gone", "/run/netns/bad", "/run/netns/empty"}), r)
	c.netnsExists = func(path string) bool { return path != "/run/netns/gone" }
	fams := scrape(t, c)

	for dev, want := range map[string]bool{"rxe0": true, "rxe2": true, "rxe4": false, "rxe6": false} {
		_, got := sample(t, fams, "rdma_port_hw_stat_total", map[string]string{"device": dev, "counter": "sent_pkts"})
		if got != want {
			t.Errorf("device %s reported = %v, want %v", dev, got, want)
		}
	}
	if got := value(t, fams, "rdma_exporter_read_errors", nil); got != 1 {
		t.Errorf("rdma_exporter_read_errors = %v, want 1 (the netns that exists but could not be read)", got)
	}
	if got := value(t, fams, "rdma_exporter_devices", nil); got != 2 {
		t.Errorf("rdma_exporter_devices = %v, want 2", got)
	}
}

func TestInventoryFailureStillServes(t *testing.T) {
	// Nothing found: the exporter's own netns is still read.
	r := &fakeReader{devices: map[string]map[string]DeviceStats{"": {"rxe0": rxeStats("rxe0", "eth0", 1, 1)}}}
	c := NewCollector(fakeInventory{err: errors.New("cannot identify the exporter's network namespace")}, r)
	fams := scrape(t, c)
	if got := value(t, fams, "rdma_exporter_read_errors", nil); got != 1 {
		t.Errorf("rdma_exporter_read_errors = %v, want 1", got)
	}
	if got := value(t, fams, "rdma_exporter_devices", nil); got != 1 {
		t.Errorf("rdma_exporter_devices = %v, want 1 (the host's device)", got)
	}
	// Records unreadable: every netns is still read, without pod labels.
	inv := nodeWith([]string{"/run/netns/a"})
	inv.err = errors.New("state dir unreadable")
	r.devices["/run/netns/a"] = map[string]DeviceStats{"rxe2": rxeStats("rxe2", "net1", 1, 1)}
	fams = scrape(t, NewCollector(inv, r))
	if got := value(t, fams, "rdma_exporter_devices", nil); got != 2 {
		t.Errorf("rdma_exporter_devices = %v with the records unreadable, want 2", got)
	}
	if _, ok := fams["go_threads"]; !ok {
		t.Errorf("the exporter's own go_threads is missing")
	}
}

// Each netns is entered once per collection, for listing and reading its
// devices alike, however many devices it has, and never more than the
// collector's bound at once, even under concurrent scrapes.
func TestConcurrentScrapesReadEachNetnsOnce(t *testing.T) {
	r := &fakeReader{devices: map[string]map[string]DeviceStats{}}
	var paths []string
	for i := range 16 {
		nsPath := fmt.Sprintf("/run/netns/pod%d", i)
		a, b := fmt.Sprintf("rxe%d", 2*i), fmt.Sprintf("rxe%d", 2*i+1)
		r.devices[nsPath] = map[string]DeviceStats{a: rxeStats(a, "net1", 1, 1), b: rxeStats(b, "net2", 1, 1)}
		paths = append(paths, nsPath)
	}
	c := NewCollector(nodeWith(paths), r)
	srv := httptest.NewServer(Handler(c, nil))
	defer srv.Close()

	const scrapes = 8
	var wg sync.WaitGroup
	errs := make(chan error, scrapes)
	for range scrapes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := http.Get(srv.URL + "/metrics")
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			fams, err := ParseText(resp.Body)
			if err != nil {
				errs <- err
				return
			}
			if n := fams["rdma_exporter_devices"].Metric[0].Gauge.GetValue(); n != 32 {
				errs <- fmt.Errorf("scrape saw %v devices, want 32", n)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// Scrapes that overlap share a collection (cache_test.go), so there
	// are at most as many collections as scrapes.
	collections := collections(c)
	if collections < 1 || collections > scrapes {
		t.Errorf("%d collections for %d scrapes", collections, scrapes)
	}
	for _, p := range append(paths, "") {
		if got := r.reads[p]; got != collections {
			t.Errorf("netns %q entered %d times in %d collections, want once per collection", p, got, collections)
		}
	}
	if m := r.maxInFlight.Load(); m > int32(c.parallel) {
		t.Errorf("%d netns read at once, want at most %d", m, c.parallel)
	}
}

func TestHealthz(t *testing.T) {
	srv := httptest.NewServer(Handler(NewCollector(nodeWith(nil), &fakeReader{}), nil))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "ok" {
		t.Errorf("/healthz = %s %q, want 200 ok", resp.Status, body)
	}
}

// Every metric of ours is named rdma_* and documented.
func TestMetricNames(t *testing.T) {
	c := NewCollector(nodeWith(nil), &fakeReader{})
	ch := make(chan *prometheus.Desc, 32)
	c.Describe(ch)
	close(ch)
	var names []string
	for d := range ch {
		s := d.String()
		name := s[strings.Index(s, `fqName: "`)+9:]
		name = name[:strings.Index(name, `"`)]
		names = append(names, name)
		if !strings.HasPrefix(name, "rdma_") {
			t.Errorf("metric %s does not start with rdma_", name)
		}
		if strings.Contains(s, `help: ""`) {
			t.Errorf("metric %s has no help text", name)
		}
	}
	if len(names) == 0 {
		t.Fatal("the collector describes no metric")
	}
}

// A device in a pod carries the pod the runtime named at ADD; a renamed
// one keeps its host name in host_device. A device in a netns that no
// record claims is reported without a pod, and so is one whose record
// names a netns its path no longer opens (the inventory's rule).
func TestPodDevicesCarryTheirPod(t *testing.T) {
	r := &fakeReader{devices: map[string]map[string]DeviceStats{
		"/run/netns/a": {"rxe2": rxeStats("rxe2", "net1", 3, 4)},
		"/run/netns/b": {"rdma_net1": rxeStats("rdma_net1", "net1", 5, 6)},
		"/run/netns/c": {"rxe6": rxeStats("rxe6", "eth6", 7, 8)},
		"/run/netns/d": {"rxe8": rxeStats("rxe8", "net1", 9, 10)},
	}}
	recA := &state.Record{Device: "rxe2", Netns: "/run/netns/a", K8sNamespace: "team-a", K8sPod: "trainer-0"}
	recB := &state.Record{Device: "rxe4", PodName: "rdma_net1", Netns: "/run/netns/b", K8sNamespace: "team-b", K8sPod: "trainer-1"}
	// An old sandbox's record: its path now opens another netns.
	recD := &state.Record{Device: "rxe8", Netns: "/run/netns/d", NetnsDev: 4, NetnsIno: 99, K8sNamespace: "team-d", K8sPod: "old"}
	fams := scrape(t, NewCollector(nodeWith([]string{"/run/netns/a", "/run/netns/b", "/run/netns/c", "/run/netns/d"}, recA, recB, recD), r))

	cases := []struct {
		labels map[string]string
		sent   float64
	}{
		{map[string]string{"device": "rxe2", "host_device": "rxe2", "netdev": "net1", "namespace": "team-a", "pod": "trainer-0"}, 3},
		{map[string]string{"device": "rdma_net1", "host_device": "rxe4", "netdev": "net1", "namespace": "team-b", "pod": "trainer-1"}, 5},
		{map[string]string{"device": "rxe6", "host_device": "rxe6", "netdev": "eth6", "namespace": "", "pod": ""}, 7},
		{map[string]string{"device": "rxe8", "host_device": "rxe8", "netdev": "net1", "namespace": "", "pod": ""}, 9},
	}
	for _, c := range cases {
		if got := value(t, fams, "rdma_port_hw_stat_total", with(c.labels, "counter", "sent_pkts")); got != c.sent {
			t.Errorf("sent_pkts%v = %v, want %v", c.labels, got, c.sent)
		}
		dev := map[string]string{"device": c.labels["device"], "host_device": c.labels["host_device"], "namespace": c.labels["namespace"], "pod": c.labels["pod"]}
		if got := value(t, fams, "rdma_device_resources", with(dev, "resource", "qp")); got != 3 {
			t.Errorf("qp%v = %v, want 3", dev, got)
		}
	}
}
