package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// A chart and a table of the same measures must come from one run. With
// -chart-dir, each shape's table is also written there as
// bench-NxE.md, beside its charts; -chart-from draws the charts again from
// such a file (or from bench's printed output), without a cluster, so a
// table in the docs and its chart are always drawn from the same results.

// tableFile is the file name of a shape's table, e.g. bench-1000x5.md.
func tableFile(n, e int) string { return fmt.Sprintf("bench-%dx%d.md", n, e) }

// writeTableFile writes one shape's table, under its heading, into dir.
func writeTableFile(dir string, n, e int, columns []string, all map[string]map[string]results) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	var b strings.Builder
	writeShape(&b, n, e, columns, all)
	path := filepath.Join(dir, tableFile(n, e))
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeShape prints one shape's heading and table, as bench prints them.
func writeShape(w io.Writer, n, e int, columns []string, all map[string]map[string]results) {
	fmt.Fprintf(w, "### %d services x %d endpoints\n\n", n, e)
	writeTable(w, columns, all)
}

// shapeTable is one shape's table read back.
type shapeTable struct {
	n, e    int
	columns []string
	all     map[string]map[string]results
}

var shapeHeading = regexp.MustCompile(`^#+ (\d+) services x (\d+) endpoints\s*$`)

// readTables reads every shape's table of bench's output (or a file
// written by writeTableFile): a heading "### N services x E endpoints",
// then a table whose header names each column group's ours, upstream and
// ours/upstream, and whose rows are the measures by their titles. Other
// lines are skipped.
func readTables(r io.Reader) ([]shapeTable, error) {
	byTitle := map[string]row{}
	for _, rw := range rows {
		byTitle[rw.title] = rw
	}
	var tables []shapeTable
	var cur *shapeTable
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if m := shapeHeading.FindStringSubmatch(text); m != nil {
			n, _ := strconv.Atoi(m[1])
			e, _ := strconv.Atoi(m[2])
			tables = append(tables, shapeTable{n: n, e: e, all: map[string]map[string]results{}})
			cur = &tables[len(tables)-1]
			continue
		}
		if cur == nil || !strings.HasPrefix(text, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(text, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		switch {
		case cells[0] == "measure":
			if (len(cells)-1)%3 != 0 {
				return nil, fmt.Errorf("line %d: a header of %d columns, not a measure and three per column group", line, len(cells))
			}
			cur.columns = nil
			for i := 1; i < len(cells); i += 3 {
				column, ok := strings.CutSuffix(cells[i], ": ours")
				if !ok || cells[i+1] != column+": upstream" || cells[i+2] != column+": ours/upstream" {
					return nil, fmt.Errorf("line %d: %q, %q, %q are not a column group's ours, upstream and ours/upstream", line, cells[i], cells[i+1], cells[i+2])
				}
				cur.columns = append(cur.columns, column)
				cur.all[column] = map[string]results{ours: {}, upstream: {}}
			}
		case strings.Trim(cells[0], "- ") == "":
			// the header's rule
		default:
			rw, ok := byTitle[cells[0]]
			if !ok {
				return nil, fmt.Errorf("line %d: no measure is titled %q", line, cells[0])
			}
			if len(cells) != 1+3*len(cur.columns) {
				return nil, fmt.Errorf("line %d: %d cells, want %d", line, len(cells), 1+3*len(cur.columns))
			}
			for i, column := range cur.columns {
				for j, proxy := range []string{ours, upstream} {
					c, ok, err := parseCell(cells[1+3*i+j])
					if err != nil {
						return nil, fmt.Errorf("line %d, %s, %s: %w", line, column, proxy, err)
					}
					if ok {
						cur.all[column][proxy][rw.key] = c
					}
				}
				if o, ok := cur.all[column][ours][rw.key]; ok {
					text := strings.TrimLeft(cells[3+3*i], "<>= ")
					if r, err := strconv.ParseFloat(text, 64); err == nil {
						o.ratio = r
						cur.all[column][ours][rw.key] = o
					}
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return tables, nil
}

// parseCell reads a cell as cell.format prints it ("1.068", ">= 600.000",
// "0.05 (in 60s)"); "-" is a value not measured.
func parseCell(s string) (cell, bool, error) {
	if s == "-" {
		return cell{}, false, nil
	}
	var c cell
	s, c.capped = strings.CutPrefix(s, ">= ")
	if i := strings.Index(s, " ("); i >= 0 && strings.HasSuffix(s, ")") {
		c.note = s[i+2 : len(s)-1]
		s = s[:i]
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return cell{}, false, fmt.Errorf("not a value: %q", s)
	}
	c.value = v
	return c, true, nil
}

// chartsFrom writes the charts of every table in the file into dir and
// prints their paths.
func chartsFrom(file, dir string, out io.Writer) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tables, err := readTables(f)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if len(tables) == 0 {
		return fmt.Errorf("%s: no table under a heading \"### N services x E endpoints\"", file)
	}
	for _, t := range tables {
		files, err := writeCharts(dir, t.n, t.e, t.columns, t.all)
		for _, f := range files {
			fmt.Fprintf(out, "Chart: %s\n", f)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
