package main

import (
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/rapidproxy/rapidproxy/deploy/monitoring"
)

// series is one line of a panel.
type series struct {
	name   string
	points plotter.XYs
}

type panel struct {
	monitoring.Panel
	series []series
}

// queryPanels runs every main panel's expressions over [start, end], as
// Grafana would for one node (the instance variable set to all).
func queryPanels(ctx context.Context, prometheus string, start, end time.Time) ([]panel, error) {
	var panels []panel
	for _, p := range monitoring.Panels() {
		if !p.Main {
			continue
		}
		pn := panel{Panel: p}
		for _, t := range p.Targets {
			ss, err := queryRange(ctx, prometheus, monitoring.Substitute(t.Expr, "kube-proxy", ".*", rateInterval), t.Legend, start, end)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p.Title, err)
			}
			pn.series = append(pn.series, ss...)
		}
		panels = append(panels, pn)
	}
	return panels, nil
}

var legendLabel = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

func queryRange(ctx context.Context, prometheus, expr, legend string, start, end time.Time) ([]series, error) {
	q := url.Values{"query": {expr}, "start": {strconv.FormatInt(start.Unix(), 10)}, "end": {strconv.FormatInt(end.Unix(), 10)},
		"step": {strconv.Itoa(int(scrapeInterval.Seconds()))}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, prometheus+"/api/v1/query_range?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var body struct {
		Status, Error string
		Data          struct {
			Result []struct {
				Metric map[string]string
				Values [][2]any
			}
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, err
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("%s: %s", expr, body.Error)
	}
	var out []series
	for _, r := range body.Data.Result {
		// One node: its address says nothing in a legend.
		name := legendLabel.ReplaceAllStringFunc(legend, func(m string) string {
			label := legendLabel.FindStringSubmatch(m)[1]
			if label == "instance" {
				return ""
			}
			return r.Metric[label]
		})
		s := series{name: strings.Join(strings.Fields(name), " ")}
		for _, v := range r.Values {
			ts, _ := v[0].(float64)
			text, _ := v[1].(string)
			f, err := strconv.ParseFloat(text, 64)
			if err != nil || f != f { // NaN: no observations in the window
				continue
			}
			s.points = append(s.points, plotter.XY{X: ts - float64(start.Unix()), Y: f})
		}
		if len(s.points) > 0 {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b series) int { return strings.Compare(a.name, b.name) })
	return out, nil
}

// scale converts a panel's unit to one a chart's axis reads well in, and
// names it; a unit without a name (short) takes what the panel says it
// counts, with the chart's rate interval for the dashboard's variable.
func scale(p monitoring.Panel) (float64, string) {
	switch p.Unit {
	case "s":
		return 1, "seconds"
	case "ops":
		return 1, "per second"
	case "bytes":
		return 1.0 / (1 << 20), "MiB"
	case "percentunit":
		return 100, "% of a CPU"
	}
	return 1, strings.ReplaceAll(p.Axis, "$__rate_interval", rateIntervalWords)
}

// palette holds one colour per line of a panel, each told apart from the
// others at a glance (Tableau's ten); a panel with more lines than
// colours goes on with the same colours dashed.
var palette = []color.Color{
	color.RGBA{0x1f, 0x77, 0xb4, 0xff}, // blue
	color.RGBA{0xff, 0x7f, 0x0e, 0xff}, // orange
	color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, // green
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, // red
	color.RGBA{0x94, 0x67, 0xbd, 0xff}, // purple
	color.RGBA{0x8c, 0x56, 0x4b, 0xff}, // brown
	color.RGBA{0xe3, 0x77, 0xc2, 0xff}, // pink
	color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, // grey
	color.RGBA{0xbc, 0xbd, 0x22, 0xff}, // olive
	color.RGBA{0x17, 0xbe, 0xcf, 0xff}, // cyan
}

// lineStyle is the colour and dashes of a panel's jth line.
func lineStyle(j int) (color.Color, []vg.Length) {
	return palette[j%len(palette)], plotutil.Dashes(j / len(palette))
}

// secondTicks mark every 30 seconds of the run, labelled every minute.
type secondTicks struct{}

func (secondTicks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for t := 0.0; t <= max; t += 30 {
		if t < min {
			continue
		}
		label := ""
		if int(t)%60 == 0 {
			label = strconv.Itoa(int(t))
		}
		ticks = append(ticks, plot.Tick{Value: t, Label: label})
	}
	return ticks
}

// render draws the panels in a grid of three columns under a title, each
// over the whole run (length seconds).
func render(out, title string, length float64, panels []panel) error {
	const cols = 3
	rows := (len(panels) + cols - 1) / cols
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.Title
		factor, unit := scale(pn.Panel)
		if unit == "" {
			return fmt.Errorf("panel %q: its y-axis has no label (unit %q and no Axis)", pn.Title, pn.Unit)
		}
		p.Y.Label.Text = unit
		p.X.Label.Text = "seconds into the run"
		p.X.Min, p.X.Max = 0, length
		p.X.Tick.Marker = secondTicks{}
		p.Legend.Top, p.Legend.Left = true, true
		p.Legend.XOffs, p.Legend.YOffs = vg.Points(10), -vg.Points(5)
		p.Add(plotter.NewGrid())
		highest := 0.0
		for j, s := range pn.series {
			pts := make(plotter.XYs, len(s.points))
			for k, xy := range s.points {
				pts[k] = plotter.XY{X: xy.X, Y: xy.Y * factor}
				highest = max(highest, pts[k].Y)
			}
			if s.name == "" {
				s.name = "kube-proxy"
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			line.Color, line.Dashes = lineStyle(j)
			line.Width = vg.Points(1.5)
			p.Add(line)
			p.Legend.Add(s.name, line)
		}
		// Room above the lines for the legend.
		p.Y.Min, p.Y.Max = 0, highest*(1.15+0.1*float64(len(pn.series)))
		if highest == 0 {
			p.Y.Max = 1
		}
		if len(pn.series) == 0 {
			p.Title.Text += " (no data)"
		}
		grid[i/cols][i%cols] = p
	}
	img := vgimg.NewWith(vgimg.UseWH(vg.Points(1350), vg.Points(float64(60+330*rows))), vgimg.UseDPI(96))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())
	header := plot.New()
	header.Title.Text = title
	header.Title.TextStyle.Font.Size = vg.Points(16)
	top := draw.Crop(dc, 0, 0, dc.Max.Y-dc.Min.Y-vg.Points(40), 0)
	header.HideAxes()
	header.Draw(top)
	body := draw.Crop(dc, 0, 0, 0, -vg.Points(45))
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(20), PadY: vg.Points(20), PadTop: vg.Points(5), PadBottom: vg.Points(10), PadLeft: vg.Points(10), PadRight: vg.Points(20)}
	canvases := plot.Align(grid, tiles, body)
	for r := range grid {
		for c, p := range grid[r] {
			if p != nil {
				p.Draw(canvases[r][c])
			}
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
