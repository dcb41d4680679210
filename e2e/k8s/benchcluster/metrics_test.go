package benchcluster

import "testing"

const scrape1 = `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="LIST",version="v1"} 10
apiserver_request_total{code="201",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="POST",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 7
apiserver_response_sizes_sum{component="apiserver",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="LIST",version="v1"} 5000
apiserver_watch_events_total{group="resource.k8s.io",resource="resourceslices",version="v1"} 200
apiserver_watch_events_sizes_sum{group="resource.k8s.io",resource="resourceslices",version="v1"} 400000
odd_metric{path="a \"quoted\" \\ value",x="1"} 3 1700000000000
`

const scrape2 = `apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="LIST",version="v1"} 12
apiserver_request_total{code="201",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="POST",version="v1"} 100
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="PUT",version="v1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="LIST",version="v1"} 70
apiserver_response_sizes_sum{component="apiserver",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="LIST",version="v1"} 6000
apiserver_watch_events_total{group="resource.k8s.io",resource="resourceslices",version="v1"} 202
apiserver_watch_events_sizes_sum{group="resource.k8s.io",resource="resourceslices",version="v1"} 404000
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="GET",version="v1"} 4
apiserver_longrunning_requests{component="apiserver",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="WATCH",version="v1"} 11
`

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(scrape1)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 7 {
		t.Fatalf("%d samples, want 7", len(m))
	}
	if got := m.Sum("odd_metric", map[string]string{"path": `a "quoted" \ value`}); got != 3 {
		t.Errorf("escaped label value: sum %v, want 3", got)
	}
	if by := m.SumBy("apiserver_request_total", "verb", map[string]string{"resource": "resourceslices"}); by["LIST"] != 10 || by["POST"] != 100 || len(by) != 2 {
		t.Errorf("by verb %v", by)
	}
	for _, bad := range []string{`x{a="1} 2`, `x{a=1} 2`, `x`, `x{a="1"} nan-ish`} {
		if _, err := ParseMetrics(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// The traffic between two scrapes is the resource's alone, by verb,
// writes apart, watch events by resource (or kind, on API servers that
// label them so).
func TestTrafficOf(t *testing.T) {
	a, _ := ParseMetrics(scrape1)
	b, _ := ParseMetrics(scrape2)
	tr := TrafficOf(a, b, "resourceslices", "ResourceSlice")
	if tr.Requests["LIST"] != 2 || tr.Requests["PUT"] != 1 || tr.Requests["GET nodes"] != 4 || len(tr.Requests) != 3 {
		t.Errorf("requests %v, want LIST 2, PUT 1 and GET nodes 4 (pods and the unchanged POST left out)", tr.Requests)
	}
	if tr.Writes() != 1 || tr.Total() != 7 || tr.Watches != 11 {
		t.Errorf("writes %v total %v watches %v, want 1, 7 and 11", tr.Writes(), tr.Total(), tr.Watches)
	}
	if tr.ResponseBytes != 1000 || tr.WatchEvents != 2 || tr.WatchBytes != 4000 {
		t.Errorf("bytes %v, watch events %v of %v bytes; want 1000, 2, 4000", tr.ResponseBytes, tr.WatchEvents, tr.WatchBytes)
	}
	byKind, _ := ParseMetrics(`apiserver_watch_events_total{group="resource.k8s.io",kind="ResourceSlice",version="v1"} 5
apiserver_watch_events_sizes_sum{group="resource.k8s.io",kind="ResourceSlice",version="v1"} 50`)
	if tr := TrafficOf(nil, byKind, "resourceslices", "ResourceSlice"); tr.WatchEvents != 5 || tr.WatchBytes != 50 {
		t.Errorf("watch events by kind: %+v", tr)
	}
}
