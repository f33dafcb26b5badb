// Package tracetest runs the modes' tables of trace cases and checks each
// outcome.
package tracetest

import (
	"math"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Want is the outcome a trace should find.
type Want struct {
	Verdict trace.Verdict
	// Endpoints are each endpoint's chance of a new connection.
	Endpoints  map[string]float64
	Masquerade bool
	// Reason and Affinity are words the outcome's must contain ("" for
	// none).
	Reason, Affinity string
}

// Check reports where r's outcome differs from want, with the trace's
// text; verbose runs log that text.
func Check(t testing.TB, want Want, r trace.Result) {
	t.Helper()
	var text strings.Builder
	trace.WriteText(&text, r)
	if r.Outcome.Verdict != want.Verdict {
		t.Errorf("verdict %q, want %q\n%s", r.Outcome.Verdict, want.Verdict, text.String())
	}
	got := map[string]float64{}
	for _, c := range r.Outcome.Endpoints {
		got[c.Endpoint] += c.Probability
	}
	if len(got) != len(want.Endpoints) {
		t.Errorf("endpoints %v, want %v\n%s", got, want.Endpoints, text.String())
	}
	for ep, p := range want.Endpoints {
		if math.Abs(got[ep]-p) > 1e-6 {
			t.Errorf("endpoint %s has probability %v, want %v\n%s", ep, got[ep], p, text.String())
		}
	}
	if r.Outcome.Masquerade != want.Masquerade {
		t.Errorf("masquerade %v, want %v\n%s", r.Outcome.Masquerade, want.Masquerade, text.String())
	}
	if !strings.Contains(r.Outcome.Reason, want.Reason) {
		t.Errorf("reason %q, want it to say %q\n%s", r.Outcome.Reason, want.Reason, text.String())
	}
	if !strings.Contains(r.Outcome.Affinity, want.Affinity) || (want.Affinity == "") != (r.Outcome.Affinity == "") {
		t.Errorf("affinity %q, want %q", r.Outcome.Affinity, want.Affinity)
	}
	if testing.Verbose() {
		t.Log("\n" + text.String())
	}
}
