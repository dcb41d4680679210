//go:build e2e

package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/rdma-netns/rdma-netns/e2e/cri/cririg"
	"github.com/rdma-netns/rdma-netns/e2e/internal/rig"
	"github.com/rdma-netns/rdma-netns/e2e/k8s/node"
)

// The suite's Prometheus: the server scripts/k8s/build.sh builds from its
// Go module (versions.env's PROMETHEUS_VERSION, Kubernetes service
// discovery alone; Debian's package has none), in the payload as
// promBinary, packed into an image and run as a pod of the cluster, under
// a ServiceAccount of its own bound to the chart's metrics reader, as a
// cluster's Prometheus runs (kube-prometheus: prometheus-k8s in
// monitoring). It discovers the exporter through the API server
// (kubernetes_sd_configs, in-cluster: its projected token and the
// kubernetes Service) and scrapes it over HTTPS with its own token. It
// runs on the node's network, as Multus's daemon does: the suite's
// cluster network (ptp) gives pods no default route, and node.ServiceForward
// puts the kubernetes Service on the node's loopback, so a pod on the
// cluster network reaches neither the Service nor the node's address
// (first run: "dial tcp 10.96.0.1:443: connect: network is unreachable").
const (
	promNS, promSA, promPod = "monitoring", "prometheus-k8s", "prometheus"
	promBinary              = "/usr/local/bin/prometheus"
	promImage               = "rdma-netns.test/prometheus:e2e"
	promPort                = 9090
	promJob                 = "rdma-netns"
	// promDiscovery is the ClusterRole Prometheus discovers pods with.
	promDiscovery = "e2e-prometheus-discovery"
)

// promConfig is docs/metrics.md's scrape configuration (without the
// operator), with a 5 s interval, so that rate() and staleness show within
// seconds.
const promConfig = `global:
  scrape_interval: 5s
  scrape_timeout: 5s
scrape_configs:
  - job_name: ` + promJob + `
    scheme: https
    tls_config:
      insecure_skip_verify: true   # the exporter's self-signed certificate
    authorization:
      credentials_file: /var/run/secrets/kubernetes.io/serviceaccount/token
    honor_labels: true             # keep namespace/pod: the pod holding the device
    kubernetes_sd_configs:
      - role: pod
        namespaces:
          names: [kube-system]
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_label_app_kubernetes_io_name, __meta_kubernetes_pod_container_port_name]
        regex: rdma-netns;metrics
        action: keep
      - source_labels: [__meta_kubernetes_pod_node_name]
        target_label: node
`

// rateInterval stands for Grafana's $__rate_interval in the dashboard's
// queries: Grafana makes it max(4 x the data source's scrape interval,
// $__interval + scrape interval), 20s for this Prometheus's 5s.
const rateInterval = "20s"

// During ib_write_bw between two RDMA pods, Prometheus, scraping the
// node's exporter as a cluster's Prometheus does, sees both pods' packet
// rates above zero (rxe counts packets, not bytes), no series for a pod
// without an RDMA device (one on the cluster network alone), and an answer to every panel query of
// conf/grafana-dashboard.json whose counters the node's devices have;
// once the pods are deleted, their series are stale at the next scrapes.
// Nothing here talks to the exporter but Prometheus.
func TestPrometheus(t *testing.T) {
	began := time.Now()
	prom := startPrometheus(t)
	t.Logf("Prometheus Ready %s after the test began", time.Since(began).Round(time.Second))
	prom.waitTargetUp(t)
	t.Logf("the exporter's target up %s after the test began", time.Since(began).Round(time.Second))

	// A pod without an RDMA device: a netns of its own on the cluster
	// network, which the exporter walks like the others.
	plain := toolsPod(workersNS, "no-rdma", "")
	delete(plain.Annotations, "k8s.v1.cni.cncf.io/networks")
	createPod(t, plain)
	t.Cleanup(func() { deletePod(t, workersNS, plain.Name, metav1.DeleteOptions{}) })
	workers := startWorkers(t)
	waitRunning(t, workersNS, plain.Name, 3*time.Minute)
	names := []string{workers[0].name, workers[1].name}
	podsRE := strings.Join(names, "|")
	traffic := loopWriteBW(t, workers[0], workers[1])
	trafficBegan := time.Now()

	// rate() over the counters both pods' devices move under traffic.
	q := fmt.Sprintf(`sum by (pod, counter) (rate(rdma_port_hw_stat_total{namespace=%q, pod=~%q, counter=~"sent_pkts|rcvd_pkts"}[%s])) > 0`, workersNS, podsRE, rateInterval)
	var rates []promSample
	err := cririg.Wait(3*time.Minute, "rate() of both pods' sent_pkts and rcvd_pkts above zero", everySecond(func() (bool, error) {
		if err := traffic.failed(); err != nil {
			t.Fatalf("ib_write_bw between %s and %s: %v", names[0], names[1], err)
		}
		var err error
		rates, err = prom.query(q)
		return len(rates) == 4, err
	}))
	if err != nil {
		all, _ := prom.query(fmt.Sprintf(`rdma_port_hw_stat_total{pod=~%q}`, podsRE))
		t.Fatalf("%v\n%s: %v\nthe pods' series:\n%v", err, q, rates, all)
	}
	t.Logf("%s after the traffic began: %s", time.Since(trafficBegan).Round(time.Second), formatSamples(rates))

	// The pods with series are the pods holding a device: not the one
	// without.
	withSeries, err := prom.query(`count by (namespace, pod) ({__name__=~"rdma_.+", pod!=""})`)
	if err != nil {
		t.Fatal(err)
	}
	var pods []string
	for _, s := range withSeries {
		pods = append(pods, s.Metric["namespace"]+"/"+s.Metric["pod"])
	}
	for _, n := range names {
		if !slices.Contains(pods, workersNS+"/"+n) {
			t.Errorf("no series of %s/%s, which holds a device: pods with series %v", workersNS, n, pods)
		}
	}
	if slices.Contains(pods, workersNS+"/"+plain.Name) {
		t.Errorf("series of %s/%s, which has no RDMA device: pods with series %v", workersNS, plain.Name, pods)
	}
	t.Logf("pods with series: %v", pods)

	checkDashboard(t, prom, names)

	runs, err := traffic.stop()
	if err != nil {
		t.Fatalf("ib_write_bw between %s and %s (run %d): %v", names[0], names[1], runs+1, err)
	}
	t.Logf("ib_write_bw ran %d times (%d x %d bytes each) in %s, across the queries above", runs, trafficIters, trafficSize, time.Since(trafficBegan).Round(time.Second))

	stopWorkers(t, workers)
	home := time.Now()
	prom.waitScrapesAfter(t, home, 2)
	gone := fmt.Sprintf(`{__name__=~"rdma_.+", pod=~%q}`, podsRE)
	if s, err := prom.query(gone); err != nil || len(s) != 0 {
		t.Errorf("%s two scrapes after the pods were deleted and their devices home: %v (%v), want nothing (stale)", gone, formatSamples(s), err)
	}
	for _, w := range workers {
		q := fmt.Sprintf(`rdma_port_state{device=%q, pod=""}`, w.dev)
		if s, err := prom.query(q); err != nil || len(s) == 0 {
			t.Errorf("%s: %v (%v), want the device back on the node", q, s, err)
		}
	}
	t.Logf("the pods' series stale %s after their devices were home", time.Since(home).Round(time.Second))
}

// The dashboard's panels: each query, its Grafana variables given
// concrete values (rateInterval; "All" for node, namespace and pod, whose
// value is the variables' allValue ".*"), answers with at least one
// series, but the panels of counters rxe does not have, which answer
// nothing here; its variables' label_values list the node, the pods'
// namespace and the pods.
func checkDashboard(t *testing.T, prom *promClient, pods []string) {
	t.Helper()
	data, err := os.ReadFile(node.ManifestDir + "/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("conf/grafana-dashboard.json: %v", err)
	}
	vars := strings.NewReplacer("$__rate_interval", rateInterval, "$namespace", ".*", "$pod", ".*", "$node", ".*")
	answered := 0
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			q := vars.Replace(tg.Expr)
			s, err := prom.query(q)
			if err != nil {
				t.Errorf("panel %q: %v", p.Title, err)
				continue
			}
			_, blind := rxeBlind[p.Title]
			switch {
			case blind && len(s) > 0:
				t.Errorf("panel %q answers on rxe (%s): take it out of rxeBlind", p.Title, formatSamples(s))
			case !blind && len(s) == 0:
				t.Errorf("panel %q: no series for %s", p.Title, q)
			case !blind:
				answered++
				t.Logf("panel %q: %s", p.Title, formatSamples(s))
			}
		}
	}
	t.Logf("%d panel queries answered; %d plot what rxe does not count: %v", answered, len(rxeBlind), rxeBlind)
	want := map[string][]string{"node": {node.Name}, "namespace": {workersNS}, "pod": pods}
	lv := regexp.MustCompile(`^label_values\((.+),\s*([a-z_]+)\)$`)
	for _, v := range dash.Templating.List {
		m := lv.FindStringSubmatch(v.Definition)
		if m == nil {
			continue // the data source
		}
		vals, err := prom.labelValues(m[2], vars.Replace(m[1]))
		if err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
			continue
		}
		for _, w := range want[v.Name] {
			if !slices.Contains(vals, w) {
				t.Errorf("variable %s (%s) lists %v, want %s among them", v.Name, v.Definition, vals, w)
			}
		}
		t.Logf("variable %s: %v", v.Name, vals)
	}
}

// rxeBlind are the dashboard's panels whose counters the VM's soft-RoCE
// devices do not have: rxe counts packets, sends and receives
// (rxe_hw_counters.c), not writes or reads, and has no standard port
// counters (no process_mad, so the kernel gives its ports no counters/).
var rxeBlind = map[string]string{
	"RDMA writes received per pod":       "irdma's iwInRdmaWrites, mlx5's rx_write_requests",
	"RDMA writes sent per pod":           "irdma's iwOutRdmaWrites",
	"RDMA reads served / issued per pod": "irdma's and mlx5's read counters",
	"Data sent per pod":                  "the standard port counter port_xmit_data",
}

// The traffic: runs of trafficIters RDMA writes of trafficSize bytes,
// about 4 s each at the emulated node's 8 MB/s.
const trafficSize, trafficIters = 65536, 500

// trafficLoop is ib_write_bw run after run until stopped.
type trafficLoop struct {
	quit, done chan struct{}
	runs       int
	err        error
}

// loopWriteBW runs ib_write_bw from cli to srv, one run after the other,
// until stopped.
func loopWriteBW(t *testing.T, srv, cli *ncclWorker) *trafficLoop {
	l := &trafficLoop{quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for {
			select {
			case <-l.quit:
				return
			default:
			}
			// A context of its own: the loop may outlive the test's
			// body, until its cleanup stops it.
			c, cancel := context.WithTimeout(context.Background(), 2*rig.VerbsTimeout)
			_, err := rig.WriteBWBetween(c, srv.peer(), cli.peer(), trafficSize, trafficIters)
			cancel()
			if err != nil {
				l.err = err
				return
			}
			l.runs++
		}
	}()
	t.Cleanup(func() { l.stop() })
	return l
}

// failed is the error that ended the loop early, if it did.
func (l *trafficLoop) failed() error {
	select {
	case <-l.done:
		if l.err == nil {
			return fmt.Errorf("the traffic stopped")
		}
		return l.err
	default:
		return nil
	}
}

// stop lets the run under way end and returns how many runs completed.
func (l *trafficLoop) stop() (int, error) {
	select {
	case <-l.quit:
	default:
		close(l.quit)
	}
	<-l.done
	return l.runs, l.err
}

// startPrometheus runs Prometheus as a pod and returns its HTTP API once
// it is ready; the pod, its ServiceAccount's bindings and its namespace
// go when the test ends.
func startPrometheus(t *testing.T) *promClient {
	t.Helper()
	archive := cririg.Dir + "/images/prometheus.tar"
	if err := cririg.WriteProgramImage(archive, promImage, promBinary); err != nil {
		t.Fatal(err)
	}
	if err := node.ImportImage(archive); err != nil {
		t.Fatal(err)
	}
	os.Remove(archive)
	c := ctx(t)
	if _, err := cs.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: promNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(ctx(t), promNS, metav1.DeleteOptions{}) })
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: promSA, Namespace: promNS}}
	if _, err := cs.CoreV1().ServiceAccounts(promNS).Create(c, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// Discovery (role: pod) lists and watches pods; the scrape needs get
	// on /metrics, the chart's metrics reader.
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: promDiscovery},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}}},
	}
	if _, err := cs.RbacV1().ClusterRoles().Create(c, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(ctx(t), promDiscovery, metav1.DeleteOptions{}) })
	for name, roleName := range map[string]string{promDiscovery: promDiscovery, "e2e-prometheus-metrics-reader": metricsReader} {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: roleName},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: promSA, Namespace: promNS}},
		}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(c, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.RbacV1().ClusterRoleBindings().Delete(ctx(t), name, metav1.DeleteOptions{}) })
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: promPod, Namespace: promNS}, Data: map[string]string{"prometheus.yml": promConfig}}
	if _, err := cs.CoreV1().ConfigMaps(promNS).Create(c, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: promPod, Namespace: promNS, Labels: map[string]string{"app.kubernetes.io/name": "prometheus"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: promSA,
			HostNetwork:        true,
			Containers: []corev1.Container{{
				Name:            "prometheus",
				Image:           promImage,
				ImagePullPolicy: corev1.PullNever,
				Args:            []string{"--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus", fmt.Sprintf("--web.listen-address=:%d", promPort)},
				Ports:           []corev1.ContainerPort{{Name: "web", ContainerPort: promPort}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/-/ready", Port: intstr.FromInt32(promPort)}},
					PeriodSeconds: 2,
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "config", MountPath: "/etc/prometheus", ReadOnly: true}, {Name: "data", MountPath: "/prometheus"}},
			}},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: promPod}}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	}
	createPod(t, pod)
	t.Cleanup(func() { deletePod(t, promNS, promPod, metav1.DeleteOptions{GracePeriodSeconds: new(int64(5))}) })
	var last *corev1.Pod
	err := cririg.Wait(3*time.Minute, "Prometheus's pod Ready", func() (bool, error) {
		p, err := cs.CoreV1().Pods(promNS).Get(ctx(t), promPod, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		last = p
		return podReady(p), nil
	})
	if err != nil {
		t.Fatalf("%v\nstatus: %+v\nevents:\n%s\nlog:\n%s", err, last.Status, events(t, promNS, promPod), podLogs(t, *last, "prometheus"))
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Prometheus's log:\n%s", podLogs(t, *last, "prometheus"))
		}
	})
	return &promClient{base: "http://" + net.JoinHostPort(last.Status.PodIP, strconv.Itoa(promPort))}
}

// promClient asks Prometheus's HTTP API (/api/v1), from the node.
type promClient struct{ base string }

// promSample is one series of an instant query's vector.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (s promSample) value() float64 {
	v, _ := s.Value[1].(string)
	f, _ := strconv.ParseFloat(v, 64)
	return f
}

func formatSamples(s []promSample) string {
	var out []string
	for _, x := range s {
		var l []string
		for _, k := range []string{"namespace", "pod", "device", "counter"} {
			if v, ok := x.Metric[k]; ok {
				l = append(l, k+"="+v)
			}
		}
		out = append(out, fmt.Sprintf("{%s} %.4g", strings.Join(l, ","), x.value()))
	}
	return "[" + strings.Join(out, " ") + "]"
}

// get GETs path with query params and decodes the API's data into data.
func (p *promClient) get(path string, params url.Values, data any) error {
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var r struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return fmt.Errorf("GET %s: %s: %v\n%.300s", path, resp.Status, err, body)
	}
	if r.Status != "success" {
		return fmt.Errorf("GET %s %v: %s: %s", path, params, resp.Status, r.Error)
	}
	return json.Unmarshal(r.Data, data)
}

// query evaluates an instant query now.
func (p *promClient) query(q string) ([]promSample, error) {
	var data struct {
		ResultType string       `json:"resultType"`
		Result     []promSample `json:"result"`
	}
	if err := p.get("/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, fmt.Errorf("query %s: %v", q, err)
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("query %s: a %s, want a vector", q, data.ResultType)
	}
	return data.Result, nil
}

// labelValues is what Grafana's label_values(selector, label) lists.
func (p *promClient) labelValues(label, selector string) ([]string, error) {
	var vals []string
	err := p.get("/api/v1/label/"+label+"/values", url.Values{"match[]": {selector}}, &vals)
	return vals, err
}

type promTarget struct {
	ScrapePool string            `json:"scrapePool"`
	Labels     map[string]string `json:"labels"`
	Health     string            `json:"health"`
	LastError  string            `json:"lastError"`
	LastScrape time.Time         `json:"lastScrape"`
}

// target is the exporter's target, the job's only one (one node).
func (p *promClient) target() (*promTarget, error) {
	var data struct {
		ActiveTargets []promTarget `json:"activeTargets"`
	}
	if err := p.get("/api/v1/targets", url.Values{"state": {"active"}}, &data); err != nil {
		return nil, err
	}
	var found []promTarget
	for _, tg := range data.ActiveTargets {
		if tg.ScrapePool == promJob {
			found = append(found, tg)
		}
	}
	if len(found) != 1 {
		return nil, fmt.Errorf("Prometheus discovered %d targets of job %s, want the node's exporter alone: %+v", len(found), promJob, data.ActiveTargets)
	}
	return &found[0], nil
}

// waitTargetUp waits for Prometheus to discover the node's exporter
// through the API server and scrape it with its token.
func (p *promClient) waitTargetUp(t *testing.T) {
	t.Helper()
	var last *promTarget
	var lastErr error
	err := cririg.Wait(2*time.Minute, "the exporter's target up in Prometheus", everySecond(func() (bool, error) {
		last, lastErr = p.target()
		return lastErr == nil && last.Health == "up", nil
	}))
	if err != nil {
		t.Fatalf("%v: last %+v (%v)", err, last, lastErr)
	}
	if last.Labels["node"] != node.Name {
		t.Errorf("the target's node label is %q, want %q (relabelled from the pod's node)", last.Labels["node"], node.Name)
	}
	t.Logf("target %v: %s, last scrape %s", last.Labels, last.Health, last.LastScrape.Format(time.RFC3339Nano))
}

// waitScrapesAfter waits for n scrapes of the exporter to have begun
// after since.
func (p *promClient) waitScrapesAfter(t *testing.T, since time.Time, n int) {
	t.Helper()
	var seen []time.Time
	err := cririg.Wait(2*time.Minute, fmt.Sprintf("%d scrapes after %s", n, since.Format(time.RFC3339Nano)), everySecond(func() (bool, error) {
		tg, err := p.target()
		if err != nil {
			return false, err
		}
		if tg.Health != "up" {
			return false, fmt.Errorf("the exporter's target is %s: %s", tg.Health, tg.LastError)
		}
		if tg.LastScrape.After(since) && (len(seen) == 0 || tg.LastScrape.After(seen[len(seen)-1])) {
			seen = append(seen, tg.LastScrape)
		}
		return len(seen) >= n, nil
	}))
	if err != nil {
		t.Fatalf("%v (saw %v)", err, seen)
	}
}

// everySecond asks cond at most once a second: each ask is a query
// Prometheus evaluates on the emulated node's two busy vCPUs.
func everySecond(cond func() (bool, error)) func() (bool, error) {
	var last time.Time
	return func() (bool, error) {
		if d := time.Until(last.Add(time.Second)); d > 0 {
			time.Sleep(d)
		}
		last = time.Now()
		return cond()
	}
}
