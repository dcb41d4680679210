package plot

import (
	"encoding/xml"
	"math"
	"strings"
	"testing"
)

// The plot is well-formed SVG with one line per series, a point per
// measured value (none for NaN), and every label escaped.
func TestSVG(t *testing.T) {
	p := &Plot{Name: "t", Title: "ADD <at once> & more", XLabel: "pods", YLabel: "ms", Xs: []float64{1, 2, 4, 8},
		Series: []Series{{Label: "ours", Ys: []float64{10, 12, math.NaN(), 30}}, {Label: "floor", Ys: []float64{8, 9, 15, 25}, Dashed: true}}}
	data := p.SVG()
	dec := xml.NewDecoder(strings.NewReader(string(data)))
	counts := map[string]int{}
	for {
		tok, err := dec.Token()
		if err != nil {
			if err.Error() != "EOF" {
				t.Fatalf("not well-formed: %v\n%s", err, data)
			}
			break
		}
		if se, ok := tok.(xml.StartElement); ok {
			counts[se.Name.Local]++
		}
	}
	if counts["polyline"] != 2 || counts["circle"] != 7 {
		t.Fatalf("%d lines and %d points, want 2 and 7:\n%s", counts["polyline"], counts["circle"], data)
	}
	if !strings.Contains(string(data), "ADD &lt;at once&gt; &amp; more") || !strings.Contains(string(data), `stroke-dasharray`) {
		t.Fatalf("title not escaped or reference not dashed:\n%s", data)
	}
}

func TestNiceStep(t *testing.T) {
	for raw, want := range map[float64]float64{0.7: 1, 1.3: 2, 3: 5, 7: 10, 130: 200, 0: 1} {
		if got := niceStep(raw); got != want {
			t.Errorf("niceStep(%v) = %v, want %v", raw, got, want)
		}
	}
}
