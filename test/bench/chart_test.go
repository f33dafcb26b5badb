package main

import (
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
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
