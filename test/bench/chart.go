package main

import (
	"bytes"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// A chart shows one column group of a table (a shape in one mode, on one
// iptables backend): per measure, a bar from 1 to ours/upstream on a log
// axis. The ratio puts seconds, MB and rule counts on one axis, and the log
// keeps 0.003 and 3 equally readable where times span 0.01 s to 1000 s.
// Each measure's label carries both values, so the chart stands without
// its table.

// chartFont is sans-serif: it stays legible at the tick labels' size.
var chartFont = font.Font{Typeface: "Liberation", Variant: "Sans"}

var (
	betterColor = color.RGBA{R: 0x2e, G: 0x8b, B: 0x57, A: 0xff} // ours smaller: faster or leaner
	worseColor  = color.RGBA{R: 0xc0, G: 0x39, B: 0x2b, A: 0xff}
	evenColor   = color.RGBA{R: 0x80, G: 0x80, B: 0x80, A: 0xff}
)

// chartBar is one measure with both proxies' values.
type chartBar struct {
	label  string // the measure
	ratio  float64
	bound  string // ">= " or "<= " when a capped value makes the ratio a bound
	values string // both proxies' values, as the table prints them
}

// chartBars are the bars of a column's measures that both proxies
// measured, in the table's order. A measure either proxy lacks, or that
// both only bound, has no ratio, and one of 0 (idle CPU under a clock tick)
// has no place on a log axis: those have no bar.
func chartBars(column string, all map[string]map[string]results) []chartBar {
	var bars []chartBar
	for _, r := range tableRows([]string{column}) {
		o, okO := all[column][ours][r.key]
		u, okU := all[column][upstream][r.key]
		if !okO || !okU || u.value == 0 || o.value == 0 || (o.capped && u.capped) {
			continue
		}
		bound := ""
		switch {
		case o.capped:
			bound = ">= "
		case u.capped:
			bound = "<= "
		}
		ratio := o.value / u.value
		if o.ratio > 0 {
			ratio = o.ratio
		}
		bars = append(bars, chartBar{
			label:  chartLabel(r.title),
			ratio:  ratio,
			bound:  bound,
			values: fmt.Sprintf("ours %s, upstream %s", o.format(r.decimals), u.format(r.decimals)),
		})
	}
	return bars
}

// chartLabel shortens a table title for the chart's axis: the metric's
// name in a title adds nothing there.
func chartLabel(title string) string {
	return strings.Replace(title, ", sync_proxy_rules_duration_seconds", "", 1)
}

// chartFile is the chart's file name for a shape and column, e.g.
// bench-1000x5-iptables-nft.svg.
func chartFile(n, e int, column string) string {
	name := column
	if columnMode(column) == modeIPTables {
		name = modeIPTables + "-" + column
	}
	name = strings.ReplaceAll(name, " -> ", " to ")
	// A switch's column, e.g. "iptables (nft) -> nftables", keeps its
	// words only: iptables-nft-to-nftables.
	words := strings.FieldsFunc(name, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	})
	return fmt.Sprintf("bench-%dx%d-%s.svg", n, e, strings.Join(words, "-"))
}

// chartTitle names the shape, mode and backend.
func chartTitle(n, e int, column string) string {
	where := column + " mode"
	switch columnMode(column) {
	case modeIPTables:
		where = "iptables mode, " + column + " backend"
	case modeSwitch:
		where = "mode switch " + column
	}
	return fmt.Sprintf("%d services x %d endpoints, %s: ours / upstream", n, e, where)
}

// writeCharts writes a chart per column of one shape's results into dir
// and returns the files written. A column with no bar gets no chart.
func writeCharts(dir string, n, e int, columns []string, all map[string]map[string]results) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var files []string
	for _, column := range columns {
		bars := chartBars(column, all)
		if len(bars) == 0 {
			continue
		}
		path := filepath.Join(dir, chartFile(n, e, column))
		if err := writeChart(path, chartTitle(n, e, column), bars); err != nil {
			return files, fmt.Errorf("chart %s: %w", path, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// chartMargin is the room left of the measures' labels.
const chartMargin = 10 // points

// labelSlack is how much wider than in Liberation Sans a label may turn
// out in a viewer's font and still end left of the axis: the SVG names
// Arial and Helvetica, which have its metrics, but a viewer with none of
// them draws in a wider sans-serif (DejaVu Sans: about a tenth wider).
const labelSlack = 1.2

// writeChart draws the bars, top to bottom in their order, as an SVG. The
// measures' labels (name, then both values) are left-aligned in a column
// of their own left of the plot, so a label that a viewer draws wider than
// laid out runs towards the axis, never off the picture's edge.
func writeChart(path, title string, bars []chartBar) error {
	p := plot.New()

	low, high := 1.0, 1.0
	for _, b := range bars {
		low, high = math.Min(low, b.ratio), math.Max(high, b.ratio)
	}
	// Whole decades, with room right of the longest bar for its value.
	p.X.Min = math.Pow(10, math.Floor(math.Log10(low)-0.05))
	p.X.Max = math.Pow(10, math.Ceil(math.Log10(high)+0.6))
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ratioTicks{}
	p.X.Label.Text = "ours / upstream (log scale): left of 1, ours is faster or smaller"
	p.X.Label.TextStyle.Font = font.From(chartFont, 11)
	p.X.Tick.Label.Font = font.From(chartFont, 10)

	p.Y.Tick.Marker = plot.ConstantTicks(nil)
	p.Y.Tick.Length = 0
	p.Y.Min, p.Y.Max = -0.6, float64(len(bars))-0.4
	p.Y.Padding = 0

	p.Add(ratioBars{bars: bars, labelFont: font.From(chartFont, 10)})

	label := p.Y.Tick.Label
	label.Font = font.From(chartFont, 10)
	label.XAlign, label.YAlign = draw.XLeft, draw.YCenter
	var widest vg.Length
	for _, b := range bars {
		widest = max(widest, label.Width(barLabel(b)))
	}
	column := vg.Points(chartMargin) + widest*labelSlack
	width := column + 8*vg.Inch
	height := vg.Length(len(bars))*0.42*vg.Inch + 1.2*vg.Inch
	c := vgsvg.New(width, height)
	dc := draw.New(c)
	// The title, left-aligned over the labels' column: a wider font runs
	// into empty room on the right.
	heading := label
	heading.Font = font.From(chartFont, 13)
	heading.YAlign = draw.YTop
	titleHeight := heading.Height(title) + vg.Points(16)
	dc.FillText(heading, vg.Point{X: dc.Min.X + vg.Points(chartMargin), Y: dc.Max.Y - vg.Points(8)}, title)
	area := draw.Crop(dc, column, 0, 0, -titleHeight)
	p.Draw(area)
	data := p.DataCanvas(area)
	_, y := p.Transforms(&data)
	for i, b := range bars {
		dc.FillText(label, vg.Point{X: dc.Min.X + vg.Points(chartMargin), Y: y(barY(i, len(bars)))}, barLabel(b))
	}
	var svg bytes.Buffer
	if _, err := c.WriteTo(&svg); err != nil {
		return err
	}
	return os.WriteFile(path, withFontFallback(svg.Bytes()), 0o644)
}

// barLabel is a bar's label: the measure, then both values.
func barLabel(b chartBar) string { return b.label + "\n" + b.values }

// withFontFallback lets a viewer without Liberation Sans use Arial or
// Helvetica, which have its metrics, so labels keep the widths they were
// laid out with. Embedding the font instead would add half a megabyte.
func withFontFallback(svg []byte) []byte {
	return bytes.ReplaceAll(svg, []byte("font-family:Liberation Sans;"),
		[]byte("font-family:'Liberation Sans',Arial,Helvetica,sans-serif;"))
}

// barY puts the first bar at the top.
func barY(i, count int) float64 { return float64(count - 1 - i) }

// ratioBars draws each bar from 1 to its ratio, a line at 1, and the ratio
// beside the bar's end.
type ratioBars struct {
	bars      []chartBar
	labelFont font.Font
}

func (r ratioBars) Plot(c draw.Canvas, p *plot.Plot) {
	x, y := p.Transforms(&c)
	half := (y(1) - y(0)) * 0.32
	for i, b := range r.bars {
		yc := y(barY(i, len(r.bars)))
		clr := evenColor
		switch {
		case b.ratio < 0.995:
			clr = betterColor
		case b.ratio > 1.005:
			clr = worseColor
		}
		x0, x1 := x(1), x(b.ratio)
		if math.Abs(float64(x1-x0)) < 1 { // a ratio of 1 still shows a sliver
			x1 = x0 + 1
		}
		c.FillPolygon(clr, c.ClipPolygonXY([]vg.Point{
			{X: x0, Y: yc - half}, {X: x1, Y: yc - half}, {X: x1, Y: yc + half}, {X: x0, Y: yc + half},
		}))
		label := draw.TextStyle{
			Color:   color.Black,
			Font:    r.labelFont,
			XAlign:  draw.XLeft,
			YAlign:  draw.YCenter,
			Handler: p.TextHandler,
		}
		at := math.Max(float64(x0), float64(x1)) + 4
		c.FillText(label, vg.Point{X: vg.Length(at), Y: yc}, b.bound+fmt.Sprintf("%.3g", b.ratio))
	}
	c.StrokeLine2(draw.LineStyle{Color: color.Black, Width: vg.Points(1.2)}, x(1), c.Min.Y, x(1), c.Max.Y)
}

// ratioTicks label each decade of the ratio as a factor (0.01x, 1x, 10x)
// with unlabelled minor ticks between.
type ratioTicks struct{}

func (ratioTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for exp := math.Floor(math.Log10(min)); math.Pow(10, exp) <= max*1.0001; exp++ {
		decade := math.Pow(10, exp)
		ticks = append(ticks, plot.Tick{Value: decade, Label: ratioTickLabel(decade)})
		for m := 2.0; m < 10 && decade*m <= max; m++ {
			ticks = append(ticks, plot.Tick{Value: decade * m})
		}
	}
	return ticks
}

func ratioTickLabel(v float64) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.6f", v), "0"), ".") + "x"
}
