package main

import (
	"fmt"
	"io"
	"strings"
)

// perServiceRows are the memory measures that writePerService divides.
var perServiceRows = []string{"steadyHeap", "steadyRSS", "peakRSS"}

// writePerService prints, when the run measured the zero-service floor
// (-n 0) beside larger shapes, what one service with its endpoints costs
// above that floor: each shape's figure less the floor's, divided by its
// number of services, ours and upstream's, and their ratio. Go's runtime
// and client-go make the floor; these are the bytes that grow.
func writePerService(w io.Writer, columns []string, shapes []shapeTable) {
	var floor *shapeTable
	for i := range shapes {
		if shapes[i].n == 0 {
			floor = &shapes[i]
		}
	}
	if floor == nil || len(shapes) < 2 {
		return
	}
	fmt.Fprintf(w, "### memory per service above the zero-service floor (KB)\n\n")
	fmt.Fprintln(w, "| shape | column | measure | ours | upstream | ours/upstream |")
	fmt.Fprintln(w, "| --- | --- | --- | --- | --- | --- |")
	for _, s := range shapes {
		if s.n == 0 {
			continue
		}
		for _, column := range columns {
			for _, key := range perServiceRows {
				ours, okOurs := perService(s, *floor, column, ours, key)
				theirs, okTheirs := perService(s, *floor, column, upstream, key)
				if !okOurs && !okTheirs {
					continue
				}
				ratio := "-"
				if okOurs && okTheirs && theirs > 0 {
					ratio = fmt.Sprintf("%.3g", ours/theirs)
				}
				fmt.Fprintf(w, "| %d x %d | %s | %s | %s | %s | %s |\n", s.n, s.e, column, rowTitle(key),
					kb(ours, okOurs), kb(theirs, okTheirs), ratio)
			}
		}
	}
	fmt.Fprintln(w)
}

// perService is one proxy's figure key in shape s less the floor's, per
// service, in KB.
func perService(s, floor shapeTable, column, proxy, key string) (float64, bool) {
	at, ok := s.all[column][proxy][key]
	base, okBase := floor.all[column][proxy][key]
	if !ok || !okBase || at.capped || base.capped {
		return 0, false
	}
	return (at.value - base.value) * 1000 / float64(s.n), true
}

func kb(v float64, ok bool) string {
	if !ok {
		return "-"
	}
	return fmt.Sprintf("%.2f", v)
}

// rowTitle is the title of the row with key, without its unit.
func rowTitle(key string) string {
	for _, r := range rows {
		if r.key == key {
			return strings.TrimSuffix(r.title, " (MB)")
		}
	}
	return key
}
