//go:build e2e

package k8s

import (
	"crypto/rand"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
)

// scrapeBench is how many requests of each kind TestBenchScrape times
// (make bench-k8s); 0 skips it, as make e2e-k8s does.
var scrapeBench = flag.Int("k8s.scrape-bench", 0, "TestBenchScrape: requests of each kind to time against the exporter, with 0 and with 8 pods holding RDMA devices (0: skip)")

// scrapeBenchPods is how many pods hold a device in the second phase.
const scrapeBenchPods = 8

// TestBenchScrape prints what a scrape of the DaemonSet's exporter costs
// through its authentication layer (HTTPS, the token checked with
// TokenReview and SubjectAccessReview against the API server, as the
// chart deploys it), with no pod holding an RDMA device and then with
// eight, each holding the device of a NIC of its own. The exporter caches
// two things, so each figure says which costs it includes: a scrape within
// --cache-max-age of the last collection is served that collection, and a
// token's verdict is kept --auth-cache-ttl. Rows: scrapes spaced past the
// cache's age (each one walks the node; the verdict cached), back-to-back
// scrapes (served from the cache), and refused requests that isolate the
// token check: a fresh token of a ServiceAccount without the right (a
// TokenReview and a SubjectAccessReview, 403), a fresh made-up token (a
// TokenReview, 401), and a token already refused (the cached verdict: the
// HTTPS round trip alone). Figures only, nothing timed is asserted; each
// collecting scrape must have collected, and each phase's exposition must
// name exactly the pods holding devices.
func TestBenchScrape(t *testing.T) {
	if *scrapeBench == 0 {
		t.Skip("a benchmark: make bench-k8s runs it (-k8s.scrape-bench N)")
	}
	maxAge, ttl := exporterCaches(t)
	nics := freeNICs(t)
	if len(nics) < scrapeBenchPods {
		t.Logf("only %d NICs are free of other uses (%v): %d pods hold devices, not %d", len(nics), nics, len(nics), scrapeBenchPods)
	}
	nics = nics[:min(len(nics), scrapeBenchPods)]
	b := &scrapeBencher{
		t: t, n: *scrapeBench, maxAge: maxAge, ttl: ttl,
		client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}},
	}
	idle := b.phase("0 pods", nil)
	pods := startScrapeBenchPods(t, nics)
	held := b.phase(fmt.Sprintf("%d pods", len(pods)), pods)
	fmt.Printf("=== K8S SCRAPE BENCH BEGIN ===\n%s=== K8S SCRAPE BENCH END ===\n", scrapeTable(t, b, nics, idle, held))
}

// exporterCaches reads the DaemonSet's exporter command: how long a
// collection (--cache-max-age) and a token's verdict (--auth-cache-ttl)
// are served, and that it checks tokens (--auth kubernetes).
func exporterCaches(t *testing.T) (maxAge, ttl time.Duration) {
	t.Helper()
	ds, err := cs.AppsV1().DaemonSets(dsNamespace).Get(ctx(t), dsName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var cmd []string
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "exporter" {
			cmd = append(c.Command, c.Args...)
		}
	}
	flagOf := func(name string) string {
		for i, a := range cmd {
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
			if a == name && i+1 < len(cmd) {
				return cmd[i+1]
			}
		}
		t.Fatalf("DaemonSet %s/%s: the exporter's command %q has no %s: the bench measures the chart's defaults, which set it", dsNamespace, dsName, cmd, name)
		return ""
	}
	if a := flagOf("--auth"); a != "kubernetes" {
		t.Fatalf("the exporter runs with --auth %s: the bench measures scrapes through the token check (--auth kubernetes)", a)
	}
	if maxAge, err = time.ParseDuration(flagOf("--cache-max-age")); err != nil {
		t.Fatal(err)
	}
	if ttl, err = time.ParseDuration(flagOf("--auth-cache-ttl")); err != nil {
		t.Fatal(err)
	}
	return maxAge, ttl
}

// freeNICs are the VM's NICs whose netdev and RDMA device are on the host
// and whose netdev carries no address (the node's own traffic, as the
// two-node boot's management NIC, has one).
func freeNICs(t *testing.T) []rig.NIC {
	t.Helper()
	all, err := rig.Layout()
	if err != nil {
		t.Fatal(err)
	}
	devs, err := rig.RDMAIn("")
	if err != nil {
		t.Fatal(err)
	}
	var free []rig.NIC
	for _, n := range all {
		l, err := netlink.LinkByName(n.Netdev)
		if err != nil || !rig.Contains(devs, n.RDMA) {
			continue
		}
		if addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL); err != nil || slices.ContainsFunc(addrs, func(a netlink.Addr) bool { return a.IP.IsGlobalUnicast() }) {
			continue
		}
		free = append(free, n)
	}
	return free
}

// scrapeBenchPod is a pod holding the RDMA device of nic.
type scrapeBenchPod struct {
	name string
	nic  rig.NIC
}

// startScrapeBenchPods starts a tools pod on a NAD of each NIC, one after
// another, checks that each holds its NIC's device alone, and deletes them
// one after another when the test ends, waiting for every device to be
// home. Not all at once: eight pods created together made Multus's daemon
// (then at its upstream manifest's limits, 100m CPU and 50Mi memory; see
// overlays/multus) crash-loop, its ADDs answering EOF, and no pod started
// in five minutes (the first run of this bench); the bench times the
// scrape, not a burst of pod starts.
func startScrapeBenchPods(t *testing.T, nics []rig.NIC) []scrapeBenchPod {
	t.Helper()
	var pods []scrapeBenchPod
	t.Cleanup(func() {
		for _, p := range pods {
			deletePod(t, "default", p.name, metav1.DeleteOptions{})
		}
		if missing, err := rig.WaitHome(nics, 2*time.Minute); err != nil || len(missing) > 0 {
			t.Errorf("after the pods' delete, not home: %v (%v)", missing, err)
		}
	})
	began := time.Now()
	for i, nic := range nics {
		p := scrapeBenchPod{name: fmt.Sprintf("scrape-bench-%d", i), nic: nic}
		nad(t, "default", p.name, nic.Netdev, fmt.Sprintf("10.100.%d.1/29", 121+i), "")
		createPod(t, toolsPod("default", p.name, p.name))
		pods = append(pods, p)
		waitRunning(t, "default", p.name, 5*time.Minute)
		if in, err := rig.RDMAIn(mustNetns(t, "default", p.name)); err != nil || len(in) != 1 || in[0] != p.nic.RDMA {
			t.Fatalf("pod %s: RDMA devices %v (%v), want [%s]", p.name, in, err, p.nic.RDMA)
		}
	}
	t.Logf("%d pods Running one after another, each with its NIC's RDMA device, %s after the first create", len(pods), time.Since(began).Round(time.Second))
	return pods
}

// scrapeBencher times requests to the exporter over one kept-alive HTTPS
// connection, as Prometheus scrapes.
type scrapeBencher struct {
	t           *testing.T
	n           int
	maxAge, ttl time.Duration
	client      *http.Client
	// token is the metrics reader's token and reviewed when its verdict
	// was first asked for: the exporter keeps it until reviewed+ttl.
	token    string
	reviewed time.Time
}

// scrapePhase is what one phase measured.
type scrapePhase struct {
	label string
	// rows by name, in scrapeRows' order.
	rows map[string][]time.Duration
	// collection is the exporter's own time for each collecting scrape
	// (rdma_exporter_scrape_duration_seconds).
	collection []time.Duration
	// collectedB2B counts the back-to-back scrapes that collected
	// (left out of their row).
	collectedB2B int
	bytes        int
	samples      int
	devices      string
}

// The rows of the table, and what each costs.
var scrapeRows = []struct{ key, what string }{
	{"collect", "scrape that collects (spaced past --cache-max-age; verdict cached)"},
	{"collection", "  its collection, as the exporter times it"},
	{"cached", "scrape served from the cache (back to back; verdict cached)"},
	{"review403", "refused 403, fresh token: TokenReview + SubjectAccessReview"},
	{"review401", "refused 401, fresh made-up token: TokenReview"},
	{"cached403", "refused 403, verdict cached: HTTPS round trip"},
}

// phase times every row with the node as it is; pods are the pods that
// hold devices, which the exposition must name, and no other.
func (b *scrapeBencher) phase(label string, pods []scrapeBenchPod) *scrapePhase {
	t := b.t
	t.Helper()
	ph := &scrapePhase{label: label, rows: map[string][]time.Duration{}}

	// Spaced past the cache's age: each scrape collects, which
	// rdma_exporter_collections_total going up by one shows.
	body := b.authorized()
	for range b.n {
		if b.verdictExpiring() {
			body = b.authorized()
		}
		prev := collections(t, body)
		time.Sleep(b.maxAge + 300*time.Millisecond)
		var d time.Duration
		body, d = b.scrape(b.token)
		if got := collections(t, body); got != prev+1 {
			t.Fatalf("%s: a scrape %v after the last collection was served collection %d, the one before %d: want a collection of its own (is something else scraping?)", label, b.maxAge+300*time.Millisecond, got, prev)
		}
		ph.rows["collect"] = append(ph.rows["collect"], d)
		ph.collection = append(ph.collection, gaugeSeconds(t, body, "rdma_exporter_scrape_duration_seconds"))
	}
	checkScrapedPods(t, label, body, pods)
	ph.bytes, ph.samples = len(body), samples(body)
	ph.devices = sampleValue(t, body, "rdma_exporter_devices")

	// Back to back, right after a collection: served from it until it is
	// --cache-max-age old; the scrapes that collected again are left out.
	if b.verdictExpiring() {
		body = b.authorized()
	}
	prev := collections(t, body)
	for range b.n {
		body, d := b.scrape(b.token)
		if got := collections(t, body); got != prev {
			ph.collectedB2B++
			prev = got
			continue
		}
		ph.rows["cached"] = append(ph.rows["cached"], d)
	}

	// The token check alone: refused requests never reach the collector.
	tenant := make([]string, b.n)
	for i := range tenant {
		tenant[i] = saToken(t, "default", "default")
	}
	for _, tok := range tenant {
		ph.rows["review403"] = append(ph.rows["review403"], b.refused(tok, http.StatusForbidden))
	}
	for range b.n {
		ph.rows["review401"] = append(ph.rows["review401"], b.refused("made-up-"+rand.Text(), http.StatusUnauthorized))
	}
	for range b.n {
		ph.rows["cached403"] = append(ph.rows["cached403"], b.refused(tenant[0], http.StatusForbidden))
	}
	ph.rows["collection"] = ph.collection
	t.Logf("%s: %d bytes, %d samples, %d of %d back-to-back scrapes collected", label, ph.bytes, ph.samples, ph.collectedB2B, b.n)
	for _, r := range scrapeRows {
		t.Logf("%s: %s: p50 %s ms, p90 %s ms", label, r.what, rig.Ms(percentile(ph.rows[r.key], 50)), rig.Ms(percentile(ph.rows[r.key], 90)))
	}
	return ph
}

// authorized scrapes with a new token of the metrics reader, whose verdict
// the exporter then keeps for the ttl, and returns the body. A 403 means
// the API server's RBAC has not seen the reader's binding yet (created by
// the first call): the next try takes a new token, the exporter keeping
// its verdict on the last one.
func (b *scrapeBencher) authorized() string {
	var code int
	var body string
	err := cririg.Wait(time.Minute, "a scrape with the metrics reader's token", func() (bool, error) {
		b.token, b.reviewed = scraperToken(b.t), time.Now()
		code, body, _ = b.get(b.token)
		if code == http.StatusForbidden {
			time.Sleep(time.Second)
		}
		return code == http.StatusOK, nil
	})
	if err != nil {
		b.t.Fatalf("%v: GET %s answered %d\n%.300s", err, exporterURL, code, body)
	}
	return body
}

// verdictExpiring says whether the token's verdict could expire before the
// next spaced scrape is done (the sleep, the scrape, a margin): the
// spaced scrapes then take a new token, so that none pays for a review.
func (b *scrapeBencher) verdictExpiring() bool {
	return time.Until(b.reviewed.Add(b.ttl)) < b.maxAge+30*time.Second
}

// scrape GETs /metrics with token, wants 200, and returns the body and the
// time from sending the request to its body's last byte.
func (b *scrapeBencher) scrape(token string) (string, time.Duration) {
	code, body, d := b.get(token)
	if code != http.StatusOK {
		b.t.Fatalf("GET %s with the metrics reader's token: %d\n%.300s", exporterURL, code, body)
	}
	return body, d
}

// refused GETs /metrics with token, wants code and no metrics, and returns
// the time taken.
func (b *scrapeBencher) refused(token string, want int) time.Duration {
	code, body, d := b.get(token)
	if code != want || strings.Contains(body, "rdma_") {
		b.t.Fatalf("GET %s with a token that may not read it: %d, want %d\n%.300s", exporterURL, code, want, body)
	}
	return d
}

func (b *scrapeBencher) get(token string) (int, string, time.Duration) {
	req, err := http.NewRequest(http.MethodGet, exporterURL, nil)
	if err != nil {
		b.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	start := time.Now()
	resp, err := b.client.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	d := time.Since(start)
	if err != nil {
		b.t.Fatalf("GET %s: reading the answer: %v", exporterURL, err)
	}
	return resp.StatusCode, string(body), d
}

// sampleValue is the value of the unlabelled sample name in an exposition.
func sampleValue(t *testing.T, body, name string) string {
	t.Helper()
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, name+" "); ok {
			return v
		}
	}
	t.Fatalf("no sample %s in the exporter's answer:\n%.500s", name, body)
	return ""
}

func collections(t *testing.T, body string) int {
	t.Helper()
	f, err := strconv.ParseFloat(sampleValue(t, body, "rdma_exporter_collections_total"), 64)
	if err != nil {
		t.Fatal(err)
	}
	return int(f)
}

func gaugeSeconds(t *testing.T, body, name string) time.Duration {
	t.Helper()
	f, err := strconv.ParseFloat(sampleValue(t, body, name), 64)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(f * float64(time.Second))
}

// samples counts an exposition's samples (its lines that are not comments).
func samples(body string) int {
	n := 0
	for _, l := range strings.Split(body, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			n++
		}
	}
	return n
}

var (
	portStateLine = regexp.MustCompile(`^rdma_port_state\{(.*)\}`)
	labelPair     = regexp.MustCompile(`(\w+)="([^"]*)"`)
)

// checkScrapedPods fails the test unless the exposition's port states name
// exactly pods, each with its NIC's RDMA device.
func checkScrapedPods(t *testing.T, label, body string, pods []scrapeBenchPod) {
	t.Helper()
	got := map[string]string{}
	for _, l := range strings.Split(body, "\n") {
		m := portStateLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, kv := range labelPair.FindAllStringSubmatch(m[1], -1) {
			labels[kv[1]] = kv[2]
		}
		if labels["pod"] != "" {
			got[labels["pod"]] = labels["host_device"]
		}
	}
	want := map[string]string{}
	for _, p := range pods {
		want[p.name] = p.nic.RDMA
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s: the exporter's port states name pods and devices %v, want %v", label, got, want)
	}
}

// scrapeTable formats both phases side by side.
func scrapeTable(t *testing.T, b *scrapeBencher, nics []rig.NIC, phases ...*scrapePhase) string {
	var names []string
	for _, n := range nics {
		names = append(names, n.Netdev+"/"+n.RDMA)
	}
	var s strings.Builder
	fmt.Fprintf(&s, "the DaemonSet's exporter (kubelet %s), GET https://127.0.0.1:9761/metrics from the node over one kept-alive connection,\n", kubeletVersion(t))
	fmt.Fprintf(&s, "--cache-max-age %v, --auth kubernetes --auth-cache-ttl %v; %d requests a row; devices held by %d pods: %s\n", b.maxAge, b.ttl, b.n, len(nics), strings.Join(names, " "))
	fmt.Fprintf(&s, "other pods on the node (no RDMA device): %d\n", otherPods(t))
	fmt.Fprintf(&s, "%-68s", "time per request, ms")
	for _, ph := range phases {
		fmt.Fprintf(&s, " %18s", ph.label+" p50 / p90")
	}
	s.WriteString("\n")
	for _, r := range scrapeRows {
		fmt.Fprintf(&s, "%-68s", r.what)
		for _, ph := range phases {
			ds := ph.rows[r.key]
			fmt.Fprintf(&s, " %18s", fmt.Sprintf("%s / %s", rig.Ms(percentile(ds, 50)), rig.Ms(percentile(ds, 90))))
		}
		s.WriteString("\n")
	}
	row := func(what string, f func(*scrapePhase) string) {
		fmt.Fprintf(&s, "%-68s", what)
		for _, ph := range phases {
			fmt.Fprintf(&s, " %18s", f(ph))
		}
		s.WriteString("\n")
	}
	row("back-to-back scrapes that collected again (left out above)", func(ph *scrapePhase) string { return strconv.Itoa(ph.collectedB2B) })
	row("answer: bytes", func(ph *scrapePhase) string { return strconv.Itoa(ph.bytes) })
	row("answer: samples", func(ph *scrapePhase) string { return strconv.Itoa(ph.samples) })
	row("answer: rdma_exporter_devices", func(ph *scrapePhase) string { return ph.devices })
	c0, c1 := percentile(phases[0].rows["collect"], 50), percentile(phases[1].rows["collect"], 50)
	if c0 > 0 {
		fmt.Fprintf(&s, "a collecting scrape with %s costs %.2fx one with %s (medians)\n", phases[1].label, float64(c1)/float64(c0), phases[0].label)
	}
	return s.String()
}

// otherPods counts the pods on the node with a network namespace of their
// own, besides the bench's: the exporter walks theirs too.
func otherPods(t *testing.T) int {
	list, err := cs.CoreV1().Pods("").List(ctx(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range list.Items {
		if !p.Spec.HostNetwork && p.Status.Phase == corev1.PodRunning && !strings.HasPrefix(p.Name, "scrape-bench-") {
			n++
		}
	}
	return n
}

// percentile is the p-th percentile of ds (nearest rank), 0 for none.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(i, 0)]
}
