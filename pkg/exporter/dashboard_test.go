package exporter

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// The Grafana dashboard in conf/ queries only metrics this collector
// serves, and groups and filters only by labels they carry (plus node,
// which the ServiceMonitor adds).
func TestDashboardQueriesOurMetrics(t *testing.T) {
	data, err := os.ReadFile("../../conf/grafana-dashboard.json")
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
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("conf/grafana-dashboard.json: %v", err)
	}

	served := map[string]bool{}
	labelNames := map[string]bool{"node": true}
	ch := make(chan *prometheus.Desc, 32)
	NewCollector(fakeInventory{}, &fakeReader{}).Describe(ch)
	close(ch)
	descName := regexp.MustCompile(`fqName: "([a-z_]+)"`)
	descLabels := regexp.MustCompile(`variableLabels: \{([a-z_,]*)\}`)
	for d := range ch {
		s := d.String()
		served[descName.FindStringSubmatch(s)[1]] = true
		if m := descLabels.FindStringSubmatch(s); m != nil {
			for _, l := range strings.Split(m[1], ",") {
				labelNames[l] = true
			}
		}
	}
	if !labelNames["pod"] || !labelNames["counter"] {
		t.Fatalf("could not read the label names of the collector's metrics: %v", labelNames)
	}

	var exprs []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	metric := regexp.MustCompile(`\brdma_[a-z_]+`)
	grouping := regexp.MustCompile(`by \(([^)]*)\)`)
	matcher := regexp.MustCompile(`([a-z_]+)\s*(=~|!=|!~|=)\s*"`)
	lvLabel := regexp.MustCompile(`label_values\([^,]+,\s*([a-z_]+)\)`)
	quoted := regexp.MustCompile(`"[^"]*"`)
	for _, e := range exprs {
		for _, m := range metric.FindAllString(quoted.ReplaceAllString(e, `""`), -1) {
			if !served[m] {
				t.Errorf("dashboard query %q uses %s, which the exporter does not serve", e, m)
			}
		}
		var used []string
		for _, g := range grouping.FindAllStringSubmatch(e, -1) {
			for _, l := range strings.Split(g[1], ",") {
				used = append(used, strings.TrimSpace(l))
			}
		}
		for _, m := range matcher.FindAllStringSubmatch(e, -1) {
			used = append(used, m[1])
		}
		for _, m := range lvLabel.FindAllStringSubmatch(e, -1) {
			used = append(used, m[1])
		}
		for _, l := range used {
			if !labelNames[l] {
				t.Errorf("dashboard query %q uses label %s, which the exporter's metrics do not carry", e, l)
			}
		}
	}
}
