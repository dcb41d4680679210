package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strings"
)

// A plot is one curve of make bench drawn as an SVG line chart: the bench
// draws its own figures, so no plot in the docs is made by hand. Text
// only, from the standard library, and in the bench program, not in the
// plugin.
type plot struct {
	name           string // file name without extension
	title          string
	xLabel, yLabel string
	xs             []float64
	series         []series
}

type series struct {
	label string
	ys    []float64 // one per x; NaN for no point
	// dashed draws a reference (a floor, a goal) rather than a measurement.
	dashed bool
}

// The palette: distinguishable, and readable in grey.
var colours = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#555555"}

const (
	plotW, plotH                       = 640, 400
	marginL, marginR, marginT, marginB = 70, 20, 40, 100
)

// svg renders the plot.
func (p *plot) svg() []byte {
	var b bytes.Buffer
	w, h := float64(plotW-marginL-marginR), float64(plotH-marginT-marginB)
	xMin, xMax := p.xs[0], p.xs[0]
	for _, x := range p.xs {
		xMin, xMax = math.Min(xMin, x), math.Max(xMax, x)
	}
	if xMax == xMin {
		xMax = xMin + 1
	}
	yMax := 0.0
	for _, s := range p.series {
		for _, y := range s.ys {
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
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", marginL, esc(p.title))
	for y := 0.0; y <= yTop+step/2; y += step {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", marginL, py(y), marginL+w, py(y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", marginL-6, py(y)+4, trimFloat(y))
	}
	for _, x := range p.xs {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#999"/>`+"\n", px(x), marginT+int(h), px(x), marginT+h+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(x), marginT+h+18, trimFloat(x))
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%.1f" stroke="black"/>`+"\n", marginL, marginT, marginL, marginT+h)
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black"/>`+"\n", marginL, marginT+h, marginL+w, marginT+h)
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", marginL+w/2, marginT+h+36, esc(p.xLabel))
	fmt.Fprintf(&b, `<text transform="translate(16 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", marginT+h/2, esc(p.yLabel))
	for i, s := range p.series {
		c := colours[i%len(colours)]
		dash := ""
		if s.dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for j, y := range s.ys {
			if j < len(p.xs) && !math.IsNaN(y) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(p.xs[j]), py(y)))
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
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", lx+26, ly, esc(s.label))
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

// emit writes the plot next to the table in the VM and prints it between
// markers, from which make bench writes it on the host (BENCH_PLOTS).
func (p *plot) emit() {
	data := p.svg()
	if err := os.WriteFile("/tmp/"+p.name+".svg", data, 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "[bench] plot %s: %v\n", p.name, err)
	}
	fmt.Printf("=== PLOT %s.svg BEGIN ===\n%s=== PLOT END ===\n", p.name, data)
}
