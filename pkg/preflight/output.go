package preflight

import (
	"encoding/json"
	"fmt"
	"github.com/rapidproxy/rapidproxy/internal/textfill"
	"io"
	"strings"
)

// width is the terminal width the text report wraps for.
const width = textfill.Width

// WriteJSON writes the report as one JSON object.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Report
		Blockers int `json:"blockers"`
		Warnings int `json:"warnings"`
	}{r, r.Count(Blocker), r.Count(Warning)})
}

// WriteText writes the report for a terminal: each finding with its
// reason, what was found and what to do, then the verdict.
func WriteText(w io.Writer, r Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "kube-proxy preflight: %s -> %s (kube-proxy at %s)\n\n", orUnknownMode(r.From), r.To, r.Address)
	if r.Note != "" {
		b.WriteString(r.Note + ".\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	for _, f := range r.Findings {
		level := strings.ToUpper(string(f.Level))
		if f.Allowed {
			level += " (allowed)"
		}
		wrap(&b, "", level+" "+f.Check+": "+f.Summary)
		wrap(&b, "  ", f.Reason)
		if len(f.Details) > 0 {
			b.WriteString("  found:\n")
			// Unwrapped: a rule is copied from here.
			for _, d := range f.Details {
				b.WriteString("    - " + d + "\n")
			}
		}
		wrap(&b, "  ", "What to do: "+f.Action)
		b.WriteString("\n")
	}
	blockers, warnings := r.Count(Blocker), r.Count(Warning)
	switch {
	case blockers > 0:
		fmt.Fprintf(&b, "%s, %s: do not switch to the %s mode yet.\n", plural(blockers, "blocker"), plural(warnings, "warning"), r.To)
	case warnings > 0:
		fmt.Fprintf(&b, "No blocker, %s: read them, then switch to the %s mode.\n", plural(warnings, "warning"), r.To)
	default:
		fmt.Fprintf(&b, "No blocker, no warning: nothing on this node stands in the way of the %s mode.\n", r.To)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func orUnknownMode(mode string) string {
	if mode == "" {
		return "(unknown mode)"
	}
	return mode
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// wrap writes text in lines for the terminal, each after indent.
func wrap(b *strings.Builder, indent, text string) {
	b.WriteString(textfill.Fill(text, indent, indent))
}
