package benchcluster

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// Metric is one sample of the API server's Prometheus text exposition:
// name{labels} value.
type Metric struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics is a scrape of /metrics.
type Metrics []Metric

// ParseMetrics reads the text exposition format: comments and blank
// lines skipped, label values unquoted (\\, \", \n escapes), an optional
// timestamp after the value ignored.
func ParseMetrics(text string) (Metrics, error) {
	var out Metrics
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for line := 1; sc.Scan(); line++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || l[0] == '#' {
			continue
		}
		m, err := parseMetric(l)
		if err != nil {
			return nil, fmt.Errorf("metrics line %d %q: %v", line, l, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func parseMetric(l string) (Metric, error) {
	m := Metric{Labels: map[string]string{}}
	i := strings.IndexAny(l, "{ ")
	if i <= 0 {
		return m, fmt.Errorf("no value")
	}
	m.Name, l = l[:i], l[i:]
	if l[0] == '{' {
		l = l[1:]
		for {
			l = strings.TrimLeft(l, " ,")
			if strings.HasPrefix(l, "}") {
				l = l[1:]
				break
			}
			eq := strings.Index(l, `="`)
			if eq <= 0 {
				return m, fmt.Errorf("bad label")
			}
			name := l[:eq]
			v, rest, err := unquote(l[eq+2:])
			if err != nil {
				return m, err
			}
			m.Labels[name], l = v, rest
		}
	}
	f := strings.Fields(l)
	if len(f) == 0 {
		return m, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return m, err
	}
	m.Value = v
	return m, nil
}

// unquote reads a label value up to its closing quote.
func unquote(s string) (v, rest string, err error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), s[i+1:], nil
		case '\\':
			if i+1 == len(s) {
				return "", "", fmt.Errorf("unterminated label value")
			}
			i++
			switch s[i] {
			case 'n':
				b.WriteByte('\n')
			default:
				b.WriteByte(s[i])
			}
		default:
			b.WriteByte(c)
		}
	}
	return "", "", fmt.Errorf("unterminated label value")
}

// Sum adds the values of name's samples whose labels include match.
func (ms Metrics) Sum(name string, match map[string]string) float64 {
	var s float64
	for _, m := range ms {
		if m.Name == name && m.has(match) {
			s += m.Value
		}
	}
	return s
}

// SumBy is Sum per value of label.
func (ms Metrics) SumBy(name, label string, match map[string]string) map[string]float64 {
	out := map[string]float64{}
	for _, m := range ms {
		if m.Name == name && m.has(match) {
			out[m.Labels[label]] += m.Value
		}
	}
	return out
}

func (m Metric) has(match map[string]string) bool {
	for k, v := range match {
		if m.Labels[k] != v {
			return false
		}
	}
	return true
}

// Traffic is what a resource cost the API server between two scrapes.
type Traffic struct {
	// Requests by verb (LIST, WATCH, GET, POST, PUT, ...); a WATCH counts
	// when it ends, as the API server counts it. Node GETs (the slice
	// controller's, for the slice's owner) are "GET nodes".
	Requests map[string]float64
	// Watches is how many WATCH requests were open at the second scrape.
	Watches float64
	// ResponseBytes are the non-watch responses' bytes; WatchEvents and
	// WatchBytes what the resource's watchers were sent.
	ResponseBytes           float64
	WatchEvents, WatchBytes float64
}

// Writes are the requests that change the resource.
func (t Traffic) Writes() float64 {
	var n float64
	// The API server's verbs are HTTP's for writes (POST a create, PUT an
	// update).
	for _, v := range []string{"POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY"} {
		n += t.Requests[v]
	}
	return n
}

// Total is every request.
func (t Traffic) Total() float64 {
	var n float64
	for _, v := range t.Requests {
		n += v
	}
	return n
}

// TrafficOf is the traffic on resource (resourceslices) of kind
// (ResourceSlice) from before to after. Watch metrics carry the resource
// or the kind depending on the API server's version: either matches.
func TrafficOf(before, after Metrics, resource, kind string) Traffic {
	t := Traffic{Requests: map[string]float64{}}
	sel := map[string]string{"resource": resource}
	b, a := before.SumBy("apiserver_request_total", "verb", sel), after.SumBy("apiserver_request_total", "verb", sel)
	for verb, v := range a {
		if d := v - b[verb]; d != 0 {
			t.Requests[verb] = d
		}
	}
	nb, na := before.Sum("apiserver_request_total", map[string]string{"resource": "nodes", "verb": "GET"}), after.Sum("apiserver_request_total", map[string]string{"resource": "nodes", "verb": "GET"})
	if d := na - nb; d != 0 {
		t.Requests["GET nodes"] = d
	}
	t.Watches = after.Sum("apiserver_longrunning_requests", map[string]string{"resource": resource, "verb": "WATCH"})
	delta := func(name string, sel map[string]string) float64 { return after.Sum(name, sel) - before.Sum(name, sel) }
	t.ResponseBytes = delta("apiserver_response_sizes_sum", sel)
	for _, s := range []map[string]string{{"resource": resource}, {"kind": kind}} {
		if e := delta("apiserver_watch_events_total", s); e != 0 {
			t.WatchEvents, t.WatchBytes = e, delta("apiserver_watch_events_sizes_sum", s)
			break
		}
	}
	return t
}
