package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// row is one measure of the table.
type row struct {
	key, title string
	decimals   int
}

// rows are the table's rows, in order. Times are seconds.
var rows = []row{
	{"firstSync", "first sync: process start -> first complete sync (s)", 3},
	{"firstSyncOwn", "first sync: its own duration, sync_proxy_rules_duration_seconds (s)", 3},
	{"restartSync", "restart over its own rules: process start -> first complete sync (s)", 3},
	{"restartSyncOwn", "restart: its first sync's own duration (s)", 3},
	{"natRules", "nat rules after the first sync (its own count)", 0},
	{"endpointSync", "endpoint change: sync duration, median (s)", 3},
	{"endpointWall", "endpoint change: API write -> sync done, median (s)", 3},
	{"addSync", "service add: sync duration, median (s)", 3},
	{"addWall", "service add: API write -> sync done, median (s)", 3},
	{"deleteSync", "service delete: sync duration, median (s)", 3},
	{"deleteWall", "service delete: API write -> sync done, median (s)", 3},
	{"restoreFloor", "floor: one service chain rewritten by iptables-restore alone, median (s)", 3},
	{"nftFloor", "floor: one service chain flushed and rewritten by nft -f alone, median (s)", 3},
	{"churnP50", "churn: API write -> DNAT rule in the kernel, p50 (s)", 3},
	{"churnP99", "churn: API write -> DNAT rule in the kernel, p99 (s)", 3},
	{"peakRSS", "peak RSS, VmHWM (MB)", 0},
	{"restartPeakRSS", "restart: peak RSS, VmHWM, before any change (MB)", 0},
	{"steadyRSS", "steady RSS, VmRSS after idling (MB)", 0},
	{"steadyHeap", "steady live heap, go_memstats_heap_inuse_bytes after idling (MB)", 0},
	{"idleCPU", "CPU while idle, user+system incl. the commands it runs (s)", 2},
	{"switchSync", "mode switch: start in the new mode -> its first complete sync (s)", 3},
	{"switchEnd", "mode switch: start -> that sync in place and nothing of the old mode left (s)", 3},
	{"switchHealthy", "mode switch: start -> /healthz answers 200 (s)", 3},
	{"switchPeakRSS", "mode switch: peak RSS, VmHWM, 5 s after the switch's end (MB)", 0},
}

// rowModes are the modes that measure a row, for the rows that not every
// mode measures: those of the iptables tools and rules, of nft's, the
// churn, which reads the rules in the node namespace's kernel (not the
// VM's), and the switch's.
var rowModes = map[string][]string{
	"natRules":      {modeIPTables},
	"restoreFloor":  {modeIPTables},
	"nftFloor":      {modeNFTables},
	"churnP50":      {modeIPTables, modeNFTables},
	"churnP99":      {modeIPTables, modeNFTables},
	"switchSync":    {modeSwitch},
	"switchEnd":     {modeSwitch},
	"switchHealthy": {modeSwitch},
	"switchPeakRSS": {modeSwitch},
}

// measured tells whether a mode measures a row. A switch measures its
// rows only.
func measured(key, mode string) bool {
	modes, ok := rowModes[key]
	if mode == modeSwitch {
		return slices.Contains(modes, mode)
	}
	return !ok || slices.Contains(modes, mode)
}

// tableRows are the rows that a column of the table measures.
func tableRows(columns []string) []row {
	var out []row
	for _, r := range rows {
		if slices.ContainsFunc(columns, func(c string) bool { return measured(r.key, columnMode(c)) }) {
			out = append(out, r)
		}
	}
	return out
}

// cell is one measured value. capped means the value is a lower bound (a
// wait hit the cap); note says something about how it was measured.
type cell struct {
	value  float64
	capped bool
	note   string
	// ratio, in ours' cell of a table read back, is the ours/upstream
	// the table printed: computed from the unrounded values, it is what
	// the chart shows, not the quotient of the rounded ones.
	ratio float64
}

// results are one proxy's cells on one backend, by row key; a missing
// key was not measured (an earlier wait was capped).
type results map[string]cell

func (c cell) format(decimals int) string {
	s := fmt.Sprintf("%.*f", decimals, c.value)
	if c.capped {
		s = ">= " + s
	}
	if c.note != "" {
		s += " (" + c.note + ")"
	}
	return s
}

// ratio is ours/upstream, with the direction a capped value allows.
func ratio(ours, upstream cell, okOurs, okUpstream bool) string {
	if !okOurs || !okUpstream || upstream.value == 0 || (ours.capped && upstream.capped) {
		return "-"
	}
	r := fmt.Sprintf("%.3g", ours.value/upstream.value)
	switch {
	case ours.capped:
		return ">= " + r
	case upstream.capped:
		return "<= " + r
	}
	return r
}

// writeTable prints a markdown table: a row per measure of its modes
// (tableRows; "-" in a column whose mode does not measure it), and per
// column group (an iptables backend, nftables or ipvs) the columns ours,
// upstream and ours/upstream.
func writeTable(w io.Writer, columns []string, all map[string]map[string]results) {
	header := []string{"measure"}
	for _, c := range columns {
		header = append(header, c+": ours", c+": upstream", c+": ours/upstream")
	}
	fmt.Fprintln(w, "| "+strings.Join(header, " | ")+" |")
	fmt.Fprintln(w, "|"+strings.Repeat(" --- |", len(header)))
	for _, r := range tableRows(columns) {
		line := []string{r.title}
		for _, c := range columns {
			o, okO := all[c][ours][r.key]
			u, okU := all[c][upstream][r.key]
			line = append(line, formatOr(o, okO, r.decimals), formatOr(u, okU, r.decimals), ratio(o, u, okO, okU))
		}
		fmt.Fprintln(w, "| "+strings.Join(line, " | ")+" |")
	}
}

func formatOr(c cell, ok bool, decimals int) string {
	if !ok {
		return "-"
	}
	return c.format(decimals)
}
