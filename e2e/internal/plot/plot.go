// Package plot draws make bench's curves as SVG line charts: the bench
// draws its own figures, so no plot in the docs is made by hand. Text only,
// from the standard library, in the bench programs, never in the plugin.
package plot

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
)

// Plot is one curve of make bench.
type Plot struct {
	Name           string // file name without extension
	Title          string
	XLabel, YLabel string
	Xs             []float64
	Series         []Series
}

// Series is one line of a plot.
type Series struct {
	Label string
	Ys    []float64 // one per x; NaN for no point
	// Dashed draws a reference (a floor, a goal) rather than a measurement.
	Dashed bool
}

// The palette: distinguishable, and readable in grey.
var colours = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#555555"}

const (
	plotW, plotH                       = 640, 400
	marginL, marginR, marginT, marginB = 70, 20, 40, 100
)

// SVG renders the plot.
func (p *Plot) SVG() []byte {
	var b bytes.Buffer
	w, h := float64(plotW-marginL-marginR), float64(plotH-marginT-marginB)
	xMin, xMax := p.Xs[0], p.Xs[0]
	for _, x := range p.Xs {
		xMin, xMax = math.Min(xMin, x), math.Max(xMax, x)
	}
	if xMax == xMin {
		xMax = xMin + 1
	}
	yMax := 0.0
	for _, s := range p.Series {
		for _, y := range s.Ys {
			if !math.IsNaN(y) {
				yMax = math.Max(yMax, y)
			}
		}
	}
	step := niceStep(yMax / 5)
	yTop := math.Max(step, math.Ceil(yMax/step)*step)
	px := func(x float64) float64 { return marginL + (x-xMin)/(xMax-xMin)*w }
	py := func(y float64) float64 { return marginT + h - y/yTop*h }

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", marginL, esc(p.Title))
	for y := 0.0; y <= yTop+step/2; y += step {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", marginL, py(y), marginL+w, py(y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, py(y)+4, trimFloat(y))
	}
	for _, x := range p.Xs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#999"/>`+"\n", px(x), marginT+int(h), px(x), marginT+h+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(x), marginT+h+18, trimFloat(x))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="black"/>`+"\n", marginL, marginT, marginL, marginT+h)
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", marginL, marginT+h, marginL+w, marginT+h)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", marginL+w/2, marginT+h+36, esc(p.XLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", marginT+h/2, esc(p.YLabel))
	for i, s := range p.Series {
		c := colours[i%len(colours)]
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for j, y := range s.Ys {
			if j < len(p.Xs) && !math.IsNaN(y) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.Xs[j]), py(y)))
			}
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", c, dash, strings.Join(pts, " "))
		for _, pt := range pts {
			xy := strings.Split(pt, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], c)
		}
		// The legend, under the axis label, two entries a row.
		lx, ly := float64(marginL)+float64(i%2)*w/2, marginT+h+56+float64(i/2)*16
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="2"%s/>`+"\n", lx, ly-4, lx+20, ly-4, c, dash)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+26, ly, esc(s.Label))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// niceStep rounds a grid step up to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.2f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// Emit writes the plot next to the table in the VM and prints it between
// markers, from which make bench writes it on the host (BENCH_PLOTS).
func (p *Plot) Emit() {
	data := p.SVG()
	if err := os.WriteFile("/tmp/"+p.Name+".svg", data, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "[bench] plot %s: %v\n", p.Name, err)
	}
	fmt.Printf("=== PLOT %s.svg BEGIN ===\n%s=== PLOT END ===\n", p.Name, data)
}
