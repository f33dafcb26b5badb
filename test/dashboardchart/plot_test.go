package main

import (
	"flag"
	"fmt"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gonum.org/v1/plot/plotter"

	"github.com/rapidproxy/rapidproxy/deploy/monitoring"
)

var sample = flag.String("sample", "", "also write the sample chart of TestRenderDrawsEveryMainPanel to this PNG, to look at")

func TestEveryMainPanelHasAYAxisLabel(t *testing.T) {
	for _, p := range monitoring.Panels() {
		if !p.Main {
			continue
		}
		if _, label := scale(p); label == "" || strings.Contains(label, "$") {
			t.Errorf("panel %q (unit %q): y-axis label %q", p.Title, p.Unit, label)
		}
	}
}

func TestLinesOfAPanelLookDifferent(t *testing.T) {
	seen := map[string]int{}
	for j := range 2 * len(palette) {
		c, dashes := lineStyle(j)
		r, g, b, _ := c.RGBA()
		key := fmt.Sprint(r, g, b, dashes)
		if i, ok := seen[key]; ok {
			t.Errorf("lines %d and %d look the same: %s", i, j, key)
		}
		seen[key] = j
	}
	// Within the palette, colours alone tell the lines apart.
	for i := range palette {
		for j := range i {
			if colourDistance(palette[i], palette[j]) < 60 {
				t.Errorf("colours %d and %d are too close: %v, %v", j, i, palette[j], palette[i])
			}
		}
	}
}

func colourDistance(a, b color.Color) float64 {
	ar, ag, ab, _ := a.RGBA()
	br, bg, bb, _ := b.RGBA()
	d := func(x, y uint32) float64 { return float64(int(x>>8) - int(y>>8)) }
	return math.Sqrt(d(ar, br)*d(ar, br) + d(ag, bg)*d(ag, bg) + d(ab, bb)*d(ab, bb))
}

// TestRenderDrawsEveryMainPanel draws the main panels over made-up lines,
// as many as a node in iptables mode gives each (eight in "iptables
// rules"), into a PNG.
func TestRenderDrawsEveryMainPanel(t *testing.T) {
	var panels []panel
	for _, p := range monitoring.Panels() {
		if !p.Main {
			continue
		}
		lines := 2 * len(p.Targets)
		if p.Title == "iptables rules" {
			lines = 8
		}
		pn := panel{Panel: p}
		for j := range lines {
			var pts plotter.XYs
			for x := 0.0; x <= 240; x += 5 {
				pts = append(pts, plotter.XY{X: x, Y: float64(j+1) * (1.2 + math.Sin(x/30+float64(j)))})
			}
			pn.series = append(pn.series, series{name: fmt.Sprintf("line %d", j+1), points: pts})
		}
		panels = append(panels, pn)
	}
	out := filepath.Join(t.TempDir(), "dashboard.png")
	if *sample != "" {
		out = *sample
	}
	if err := render(out, "made-up lines", 240, panels); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() < 1000 || b.Dy() < 900 {
		t.Errorf("the chart is %v", b)
	}
	// The chart draws in the palette's colours, each of the eight lines of
	// "iptables rules" in its own.
	used := map[color.Color]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			used[color.RGBA{uint8(r >> 8), uint8(g >> 8), uint8(bl >> 8), 0xff}] = true
		}
	}
	for i, c := range palette[:8] {
		if !used[c] {
			t.Errorf("colour %d (%v) is not drawn", i, c)
		}
	}
}
