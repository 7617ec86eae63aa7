package main

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// plot geometry, in SVG user units.
const (
	plotW, plotH           = 720, 520
	left, right, top, foot = 64, 40, 40, 144 // foot holds the axis title and the legend
)

// curveSVG plots the foreground's p99 and p50, over the alone windows
// either side, against the deletion rate: a line through the marker
// sweep's budgets (and flat out), one through the table sweep's of
// river_job, a point for River.
func curveSVG(w io.Writer, rows []curveRow, title string) error {
	budgets, off, river, tables := curvePoints(rows)
	// The rates span two decades: a log axis from the 1-2-5 step below
	// the slowest to the one above the fastest.
	xMin, xMax, yMax := river.rate, river.rate, river.x99
	for _, b := range append(append(budgets, off...), tables...) {
		xMin, xMax, yMax = min(xMin, b.rate), max(xMax, b.rate), max(yMax, b.x99, b.x50)
	}
	var xTicks []float64
	for d := math.Pow(10, math.Floor(math.Log10(xMin))); len(xTicks) == 0 || xTicks[len(xTicks)-1] < xMax; d *= 10 {
		xTicks = append(xTicks, d, 2*d, 5*d)
	}
	for len(xTicks) > 1 && xTicks[len(xTicks)-2] >= xMax {
		xTicks = xTicks[:len(xTicks)-1]
	}
	for len(xTicks) > 1 && xTicks[1] <= xMin {
		xTicks = xTicks[1:]
	}
	lo, hi := math.Log10(xTicks[0]), math.Log10(xTicks[len(xTicks)-1])
	yStep := niceStep(yMax, 6)
	yMax = math.Ceil(yMax*1.05/yStep) * yStep
	px := func(v float64) float64 { return left + (math.Log10(v)-lo)/(hi-lo)*(plotW-left-right) }
	py := func(v float64) float64 { return plotH - foot - v/yMax*(plotH-top-foot) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">%s</text>`+"\n", left, escape(title))
	for _, v := range xTicks {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", px(v), top, px(v), plotH-foot)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px(v), plotH-foot+16, count(v))
	}
	for v := 0.0; v <= yMax+yStep/2; v += yStep {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, py(v), plotW-right, py(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%g×</text>`+"\n", left-6, py(v)+4, v)
	}
	fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#555" stroke-dasharray="2 3"/>`+"\n", left, py(1), plotW-right, py(1))
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">deleted per second (log scale)</text>`+"\n", (left+plotW-right)/2, plotH-foot+36)
	fmt.Fprintf(&b, `<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">foreground latency × alone</text>`+"\n", (top+plotH-foot)/2)

	// line draws a series: circles for the marker sweep, triangles for
	// the table sweep.
	line := func(rows []curveRow, color string, y func(curveRow) float64, dash string, fill bool, triangle bool) {
		var pts []string
		for _, r := range rows {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(r.rate), py(y(r))))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2" stroke-dasharray="%s"/>`+"\n", strings.Join(pts, " "), color, dash)
		dot := "white"
		if fill {
			dot = color
		}
		for _, r := range rows {
			if triangle {
				fmt.Fprintf(&b, `<path d="M%.1f %.1f l5 9 h-10 z" fill="%s" stroke="%s" stroke-width="2"/>`+"\n", px(r.rate), py(y(r))-6, dot, color)
			} else {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s" stroke="%s" stroke-width="2"/>`+"\n", px(r.rate), py(y(r)), dot, color)
			}
		}
	}
	const marker, table = "#1f5fa8", "#2a8a4a"
	line(budgets, marker, func(r curveRow) float64 { return r.x99 }, "none", true, false)
	line(budgets, marker, func(r curveRow) float64 { return r.x50 }, "6 4", false, false)
	line(tables, table, func(r curveRow) float64 { return r.x99 }, "none", true, true)
	line(tables, table, func(r curveRow) float64 { return r.x50 }, "6 4", false, true)
	label := func(r curveRow, color string) {
		text := fmt.Sprintf("%.0f%%", r.c.percent)
		if r.c.limit == 0 {
			text = "flat out"
		}
		x, y, anchor := px(r.rate), py(r.x99)-10, "middle"
		switch {
		case r.c.atRiver && r.c.table: // among the crowd around River's point: above left
			x, y, anchor, text = x-8, y-4, "end", "at River's rate"
		case r.c.atRiver: // below right
			x, y, anchor = x+6, y+26, "start"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="%s" text-anchor="%s">%s</text>`+"\n", x, y, color, anchor, escape(text))
	}
	for _, r := range budgets {
		label(r, marker)
	}
	for _, r := range tables {
		label(r, table)
	}
	for _, r := range off {
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="10" height="10" fill="#1f5fa8"/>`+"\n", px(r.rate)-5, py(r.x99)-5)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="10" height="10" fill="white" stroke="#1f5fa8" stroke-width="2"/>`+"\n", px(r.rate)-5, py(r.x50)-5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#1f5fa8" text-anchor="end">batches of %s</text>`+"\n", px(r.rate)-9, py(r.x99)+4, count(float64(r.c.batch)))
	}
	diamond := func(x, y float64, fill string) {
		fmt.Fprintf(&b, `<path d="M%.1f %.1f l7 7 l-7 7 l-7 -7 z" fill="%s" stroke="#c0392b" stroke-width="2"/>`+"\n", x, y-7, fill)
	}
	diamond(px(river.rate), py(river.x99), "#c0392b")
	diamond(px(river.rate), py(river.x50), "white")
	fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" fill="#c0392b" text-anchor="middle">River</text>`+"\n", px(river.rate), py(river.x50)+24)

	legend := []struct{ mark, text string }{
		{`<line x1="0" y1="0" x2="24" y2="0" stroke="#1f5fa8" stroke-width="2"/><circle cx="12" cy="0" r="4" fill="#1f5fa8"/>`, "marker table: budgets (share of flat out), p99"},
		{`<line x1="0" y1="0" x2="24" y2="0" stroke="#1f5fa8" stroke-width="2" stroke-dasharray="6 4"/><circle cx="12" cy="0" r="4" fill="white" stroke="#1f5fa8" stroke-width="2"/>`, "marker table: budgets, p50"},
		{`<line x1="0" y1="0" x2="24" y2="0" stroke="#2a8a4a" stroke-width="2"/><path d="M12 -6 l5 9 h-10 z" fill="#2a8a4a"/>`, "river_job itself (table sweep), p99"},
		{`<line x1="0" y1="0" x2="24" y2="0" stroke="#2a8a4a" stroke-width="2" stroke-dasharray="6 4"/><path d="M12 -6 l5 9 h-10 z" fill="white" stroke="#2a8a4a" stroke-width="2"/>`, "river_job itself (table sweep), p50"},
		{`<path d="M12 -6 l6 6 l-6 6 l-6 -6 z" fill="#c0392b"/>`, "River's cleaner, p99"},
		{`<path d="M12 -6 l6 6 l-6 6 l-6 -6 z" fill="white" stroke="#c0392b" stroke-width="2"/>`, "River's cleaner, p50"},
		{`<rect x="7" y="-5" width="10" height="10" fill="#1f5fa8"/>`, "marker table at River's rate in its batches, p99 (hollow: p50)"},
	}
	for i, l := range legend {
		fmt.Fprintf(&b, `<g transform="translate(%d %d)">%s<text x="32" y="4">%s</text></g>`+"\n", left+i%2*330, plotH-foot+62+20*(i/2), l.mark, escape(l.text))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceStep returns a grid step of 1, 2 or 5 times a power of ten that
// cuts 0..v into about n parts.
func niceStep(v float64, n int) float64 {
	raw := v / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
