package main

import (
	"encoding/xml"
	"errors"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"gonum.org/v1/plot/font"
)

// chartTable is a small table as a run would fill it: times from 0.01 s to
// minutes, a capped value, and a measure upstream lacks.
func chartTable() map[string]map[string]results {
	return map[string]map[string]results{
		"nft": {
			ours: {
				"firstSync":    {value: 7.9},
				"endpointSync": {value: 0.024},
				"natRules":     {value: 17005},
				"peakRSS":      {value: 53},
				"restartSync":  {value: 3.1},
				"idleCPU":      {value: 0.05, note: "in 10s"},
			},
			upstream: {
				"firstSync":    {value: 802.4},
				"endpointSync": {value: 0.066},
				"natRules":     {value: 17005},
				"peakRSS":      {value: 83},
				"restartSync":  {value: 600, capped: true},
			},
		},
	}
}

func TestChartDrawsEachMeasureOfATable(t *testing.T) {
	dir := t.TempDir()
	files, err := writeCharts(dir, 1000, 5, []string{"nft"}, chartTable())
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "bench-1000x5-iptables-nft.svg")
	if len(files) != 1 || files[0] != want {
		t.Fatalf("files %v, want [%s]", files, want)
	}
	texts := svgTexts(t, want)
	for _, label := range []string{
		"1000 services x 5 endpoints, iptables mode, nft backend: ours / upstream",
		"first sync: process start -> first complete sync (s)",
		"ours 7.900, upstream 802.400",
		"endpoint change: sync duration, median (s)",
		"nat rules after the first sync (its own count)",
		"peak RSS, VmHWM (MB)",
		"restart over its own rules: process start -> first complete sync (s)",
		"<= 0.00517", // ours over a capped upstream: an upper bound
		"0.00985",
		"1x",
	} {
		if !slices.Contains(texts, label) {
			t.Errorf("the chart has no text %q; it has %q", label, texts)
		}
	}
	if slices.Contains(texts, "CPU while idle, user+system incl. the commands it runs (s)") {
		t.Error("the chart shows idle CPU, which upstream did not measure")
	}
}

func TestChartFileNamesEachModeAndBackend(t *testing.T) {
	for column, want := range map[string]string{
		"nft":                        "bench-1000x5-iptables-nft.svg",
		"legacy":                     "bench-1000x5-iptables-legacy.svg",
		"nftables":                   "bench-1000x5-nftables.svg",
		"ipvs":                       "bench-1000x5-ipvs.svg",
		"iptables (nft) -> nftables": "bench-1000x5-iptables-nft-to-nftables.svg",
		"nftables -> iptables (nft)": "bench-1000x5-nftables-to-iptables-nft.svg",
	} {
		if got := chartFile(1000, 5, column); got != want {
			t.Errorf("chartFile(%q) = %q, want %q", column, got, want)
		}
	}
}

func TestChartSkipsAColumnWithoutRatios(t *testing.T) {
	all := map[string]map[string]results{"nft": {ours: {"firstSync": {value: 1}}}}
	files, err := writeCharts(t.TempDir(), 10, 1, []string{"nft"}, all)
	if err != nil || len(files) != 0 {
		t.Fatalf("files %v, err %v; want none", files, err)
	}
}

// svgTexts parses the file as XML, fails the test unless its root is an
// svg element, and returns the lines of its text elements.
func svgTexts(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d := xml.NewDecoder(f)
	var texts []string
	root, inText := "", 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s is not well-formed XML: %v", path, err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			if tok.Name.Local == "text" {
				inText++
			}
		case xml.EndElement:
			if tok.Name.Local == "text" {
				inText--
			}
		case xml.CharData:
			if inText > 0 {
				if s := strings.TrimSpace(string(tok)); s != "" {
					texts = append(texts, s)
				}
			}
		}
	}
	if root != "svg" {
		t.Fatalf("%s: root element %q, want svg", path, root)
	}
	return texts
}

// TestChartLabelsStayInsideThePicture: every text starts right of the
// left margin, and the measures' labels leave room before the plot for a
// viewer's font a fifth wider than the one they were laid out in.
func TestChartLabelsStayInsideThePicture(t *testing.T) {
	dir := t.TempDir()
	files, err := writeCharts(dir, 1000, 5, []string{"nft"}, chartTable())
	if err != nil || len(files) != 1 {
		t.Fatalf("files %v, err %v", files, err)
	}
	svg, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	texts := regexp.MustCompile(`<text x="([-0-9.e]+)"([^>]*)>([^<]*)</text>`).FindAllStringSubmatch(string(svg), -1)
	if len(texts) == 0 {
		t.Fatal("no text in the chart")
	}
	// The plot's left edge: the leftmost x of a path that is not the
	// background (which starts at 0).
	plotLeft := math.Inf(1)
	for _, m := range regexp.MustCompile(`<path d="M([-0-9.e]+),`).FindAllStringSubmatch(string(svg), -1) {
		if x, _ := strconv.ParseFloat(m[1], 64); x > 0 {
			plotLeft = math.Min(plotLeft, x)
		}
	}
	tickLabel := regexp.MustCompile(`^[0-9.]+x$`)
	label := font.From(chartFont, 10)
	face := font.DefaultCache.Lookup(label, label.Size)
	var width float64
	if m := regexp.MustCompile(`viewBox="0 0 ([0-9.]+) `).FindStringSubmatch(string(svg)); m != nil {
		width, _ = strconv.ParseFloat(m[1], 64)
	}
	title := font.From(chartFont, 13)
	titleFace := font.DefaultCache.Lookup(title, title.Size)
	for _, m := range texts {
		x, _ := strconv.ParseFloat(m[1], 64)
		text := html.UnescapeString(m[3])
		if x < chartMargin-0.01 {
			t.Errorf("%q starts at x=%g, left of the margin (%d)", text, x, chartMargin)
		}
		if strings.Contains(m[2], "font-size:13px") {
			if end := x + titleFace.Width(text).Points()*labelSlack; end > width {
				t.Errorf("the title %q ends at x=%g with a font a fifth wider, past the picture's width %g", text, end, width)
			}
			continue
		}
		if x < plotLeft && !tickLabel.MatchString(text) { // a tick label is centred on its tick
			if end := x + face.Width(text).Points()*labelSlack; end > plotLeft {
				t.Errorf("%q ends at x=%g with a font a fifth wider, past the plot's left edge at %g", text, end, plotLeft)
			}
		}
	}
}

// TestTablesReadBackAsWritten: a table as bench prints it reads back into
// the same results, so -chart-from draws what the run drew.
func TestTablesReadBackAsWritten(t *testing.T) {
	want := chartTable()
	want["legacy"] = map[string]results{ours: {"firstSync": {value: 0.35}}, upstream: {"firstSync": {value: 1.004}}}
	var b strings.Builder
	b.WriteString("Some progress line\n\n")
	writeShape(&b, 1000, 5, []string{"nft", "legacy"}, want)
	tables, err := readTables(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 1 || tables[0].n != 1000 || tables[0].e != 5 || !slices.Equal(tables[0].columns, []string{"nft", "legacy"}) {
		t.Fatalf("tables %+v", tables)
	}
	for column, proxies := range want {
		for proxy, cells := range proxies {
			for key, c := range cells {
				got := tables[0].all[column][proxy][key]
				// The table rounds to the row's decimals.
				if got.capped != c.capped || got.note != c.note || math.Abs(got.value-c.value) > 0.0005*math.Max(1, c.value) {
					t.Errorf("%s %s %s: read %+v, wrote %+v", column, proxy, key, got, c)
				}
			}
		}
	}

	dir := t.TempDir()
	file := filepath.Join(dir, tableFile(1000, 5))
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := chartsFrom(file, dir, &out); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"bench-1000x5-iptables-nft.svg", "bench-1000x5-iptables-legacy.svg"} {
		if !strings.Contains(out.String(), filepath.Join(dir, name)) {
			t.Errorf("chartsFrom printed %q, without %s", out.String(), name)
		}
	}
	if !slices.Contains(svgTexts(t, filepath.Join(dir, "bench-1000x5-iptables-nft.svg")), "ours 7.900, upstream 802.400") {
		t.Error("the chart drawn from the table lacks its values")
	}
}

func TestTablesWithAnUnknownMeasureAreRefused(t *testing.T) {
	text := "### 10 services x 1 endpoints\n\n| measure | nft: ours | nft: upstream | nft: ours/upstream |\n| --- | --- | --- | --- |\n| first sync (renamed) | 1.000 | 2.000 | 0.5 |\n"
	if _, err := readTables(strings.NewReader(text)); err == nil || !strings.Contains(err.Error(), "first sync (renamed)") {
		t.Errorf("err %v, want one naming the measure", err)
	}
}
