package doctor

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// prefixNADs are n NADs, each in a namespace of its own, whose rdma-netns
// entry has what set gives the i-th (podRdmaDevNamePrefix, rdmaDevName).
func prefixNADs(t *testing.T, n int, set func(i int) map[string]any) string {
	t.Helper()
	items := make([]map[string]any, 0, n)
	for i := range n {
		c := rdma(t, exampleConfig(t, "nad-host-device.yaml"), set(i))
		items = append(items, nadItem(t, fmt.Sprintf("team-%04d", i), "rdma", "", c))
	}
	return listJSON(t, items...)
}

// Many NADs under one prefix, or under prefixes that start one another:
// one finding per prefix or per NAD, naming the first few of the others
// and counting the rest.
func TestNADsNamesGrouped(t *testing.T) {
	tests := []struct {
		name string
		set  func(i int) map[string]any
		want []wantFinding
	}{{
		name: "five namespaces share a prefix",
		set:  func(int) map[string]any { return map[string]any{"podRdmaDevNamePrefix": "rdma_"} },
		want: []wantFinding{{OK, "name-prefix-overlap", "team-0000/rdma", []string{
			"pods of 5 NADs in 5 namespaces, team-0000/rdma, team-0001/rdma, team-0002/rdma and 2 more, all with podRdmaDevNamePrefix rdma_, may ask for the same device names"}}},
	}, {
		name: "a prefix, then four namespaces whose prefix starts with it",
		set: func(i int) map[string]any {
			if i == 0 {
				return map[string]any{"podRdmaDevNamePrefix": "rdma_"}
			}
			return map[string]any{"podRdmaDevNamePrefix": "rdma_b"}
		},
		want: []wantFinding{
			{OK, "name-prefix-overlap", "team-0000/rdma", []string{
				"pods of team-0000/rdma (podRdmaDevNamePrefix rdma_) and of 4 NADs in other namespaces whose prefix starts with it or that it starts with, team-0001/rdma (podRdmaDevNamePrefix rdma_b), team-0002/rdma (podRdmaDevNamePrefix rdma_b), team-0003/rdma (podRdmaDevNamePrefix rdma_b) and 1 more,"}},
			{OK, "name-prefix-overlap", "team-0001/rdma", []string{"pods of 4 NADs in 4 namespaces, team-0001/rdma, team-0002/rdma, team-0003/rdma and 1 more, all with podRdmaDevNamePrefix rdma_b"}},
		},
	}, {
		name: "one prefix covers four other NADs' names",
		set: func(i int) map[string]any {
			if i == 0 {
				return map[string]any{"podRdmaDevNamePrefix": "rdma_"}
			}
			return map[string]any{"rdmaDevName": fmt.Sprintf("rdma_%d", i)}
		},
		want: []wantFinding{{Warn, "name-squat", "team-0000/rdma", []string{
			"pods of team-0000/rdma (podRdmaDevNamePrefix rdma_) may name their device with 4 rdmaDevName(s) other NADs give their pods: rdma_1 (team-0001/rdma), rdma_2 (team-0002/rdma), rdma_3 (team-0003/rdma) and 1 more;",
			"fix: keep podRdmaDevNamePrefix disjoint from every rdmaDevName: change the podRdmaDevNamePrefix rdma_, or the rdmaDevName of each NAD listed"}}},
	}, {
		name: "four NADs share a name",
		set:  func(int) map[string]any { return map[string]any{"rdmaDevName": "rdma_net1"} },
		want: []wantFinding{{OK, "shared-dev-name", "rdma_net1", []string{"team-0000/rdma, team-0001/rdma, team-0002/rdma and 2 more all set rdmaDevName rdma_net1"}}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := CheckNADs(strings.NewReader(prefixNADs(t, 5, tt.set)))
			checkFindings(t, r, tt.want)
		})
	}
}

// 5,000 NADs: the report takes well under 2 s, and under 1 MiB of text
// for NADs sharing one prefix, where findings per pair took gigabytes.
// Its size is linear in the NADs whatever their prefixes: under 1 KiB a
// NAD where every NAD overlaps half the others.
func TestNADsNamesScale(t *testing.T) {
	const n = 5000
	for _, c := range []struct {
		name     string
		set      func(i int) map[string]any
		findings int
		maxText  int
	}{
		{"one prefix", func(int) map[string]any { return map[string]any{"podRdmaDevNamePrefix": "rdma_"} }, 1, 1 << 20},
		{"one prefix, and each NAD's name under it", func(i int) map[string]any {
			return map[string]any{"podRdmaDevNamePrefix": "rdma_", "rdmaDevName": fmt.Sprintf("rdma_%04d", i)}
		}, 2, 1 << 20},
		// Each NAD overlaps every later one of the other prefix: one
		// finding each (and one per prefix), of a bounded size.
		{"two prefixes, one starting the other, alternating", func(i int) map[string]any {
			return map[string]any{"podRdmaDevNamePrefix": []string{"rdma_", "rdma_b"}[i%2]}
		}, n + 2, n << 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := prefixNADs(t, n, c.set)
			start := time.Now()
			r := CheckNADs(strings.NewReader(in))
			var text bytes.Buffer
			if err := r.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			t.Logf("%d NADs (%d KiB of JSON), %s: %d findings, %d KiB of text, in %v", n, len(in)>>10, c.name, len(r.Findings), text.Len()>>10, took.Round(time.Millisecond))
			if len(r.Findings) > c.findings || text.Len() > c.maxText || took > 2*time.Second {
				t.Errorf("%d findings, %d bytes of text, %v: want at most %d findings, %d bytes, 2s", len(r.Findings), text.Len(), took, c.findings, c.maxText)
			}
		})
	}
}
