package trace

import (
	"fmt"
	"io"
	"strings"

	"github.com/rapidproxy/rapidproxy/internal/textfill"
)

// WriteText writes a trace for an 80-column terminal: the packet, the
// steps every way through shares, each way on from there with its
// chance, and the outcome.
func WriteText(w io.Writer, r Result) {
	fmt.Fprintf(w, "Packet %s\n", r.Packet)
	fmt.Fprintf(w, "Node %s, %s mode, %s\n", r.Node, r.Mode, r.Family)
	if r.Service != "" {
		fmt.Fprintf(w, "Service port %s, by its %s (%s path)\n", r.Service, r.Entry, r.Path)
	} else {
		fmt.Fprintln(w, "No service port of this node is at this address and port")
	}
	fmt.Fprintln(w)
	writeSteps(w, r.Steps, "  ")
	if len(r.Branches) > 1 {
		for _, b := range r.Branches {
			fmt.Fprintf(w, "  %s: %s\n", percent(b.Probability), branchEnd(b))
			writeSteps(w, b.Steps, "      ")
		}
	} else if len(r.Branches) == 1 {
		writeSteps(w, r.Branches[0].Steps, "  ")
	}
	fmt.Fprintln(w)
	io.WriteString(w, textfill.Fill(outcomeText(r.Outcome), "Outcome: ", "         "))
	if r.Outcome.Affinity != "" {
		io.WriteString(w, textfill.Fill(r.Outcome.Affinity, "Affinity: ", "          "))
	}
	if r.Outcome.Reason != "" {
		io.WriteString(w, textfill.Fill(r.Outcome.Reason, "Reason: ", "        "))
	}
	if v := r.Verify; v != nil {
		switch {
		case v.Error != "":
			io.WriteString(w, textfill.Fill("could not read the kernel: "+v.Error, "Verify: ", "        "))
		case len(v.Differences) == 0:
			fmt.Fprintln(w, "Verify: the kernel holds the service's objects as traced")
		default:
			fmt.Fprintln(w, "Verify: the kernel differs from what was traced:")
			for _, d := range v.Differences {
				io.WriteString(w, textfill.Fill(d, "  - ", "    "))
			}
		}
	}
}

func writeSteps(w io.Writer, steps []Step, indent string) {
	for _, s := range steps {
		text := s.What
		if s.Note != "" {
			text += " (" + s.Note + ")"
		}
		io.WriteString(w, textfill.Fill(text, indent+s.Where+": ", indent+"    "))
	}
}

func branchEnd(b Branch) string {
	out := string(b.Verdict)
	if b.Verdict == DNAT {
		out = "DNAT to " + b.Endpoint
	}
	if b.Masquerade {
		out += ", masqueraded"
	}
	return out
}

func outcomeText(o Outcome) string {
	var out string
	switch o.Verdict {
	case DNAT:
		parts := make([]string, len(o.Endpoints))
		for i, c := range o.Endpoints {
			parts[i] = c.Endpoint + " " + percent(c.Probability)
			if c.Masquerade && !o.Masquerade {
				parts[i] += " (masqueraded)"
			}
		}
		out = fmt.Sprintf("DNAT to one of %d endpoints: %s", len(o.Endpoints), strings.Join(parts, ", "))
		if len(o.Endpoints) == 1 {
			out = "DNAT to " + parts[0]
		}
	case Drop:
		out = "dropped"
	case Reject:
		out = "rejected"
	case PassedOn:
		out = "passed on unchanged"
	default:
		out = string(o.Verdict) + ": see each way above"
	}
	if o.Masquerade {
		out += "; masqueraded (the source becomes this node's address)"
	} else if o.Verdict == DNAT {
		out += "; not masqueraded"
	}
	return out
}

// percent is a probability as a percentage with one decimal.
func percent(p float64) string {
	return fmt.Sprintf("%.1f%%", p*100)
}
