package trace

import (
	"cmp"
	"slices"

	v1 "k8s.io/api/core/v1"
)

// Result is one packet's trace on this node.
type Result struct {
	Packet Packet      `json:"packet"`
	Node   string      `json:"node"`
	Mode   string      `json:"mode"`
	Family v1.IPFamily `json:"family"`
	// Service is the service port the packet is addressed to, and Entry
	// how; both empty when it is addressed to none.
	Service string `json:"service,omitempty"`
	Entry   Entry  `json:"entry,omitempty"`
	// Path is the set of endpoints the service's rules send it to,
	// "cluster" or "local", as explain names them; empty when none.
	Path string `json:"path,omitempty"`
	// Steps are what every way through has in common, in order; each of
	// Branches goes on from there.
	Steps    []Step   `json:"steps"`
	Branches []Branch `json:"branches"`
	Outcome  Outcome  `json:"outcome"`
	// Verify is what a check of the traced objects against the kernel
	// found, when asked for.
	Verify *Verification `json:"verify,omitempty"`
}

// Outcome is where the packet ends, summed over the branches.
type Outcome struct {
	// Verdict is the branches' verdict when they agree, "mixed" if not.
	Verdict Verdict `json:"verdict"`
	// Endpoints are where a DNAT may send it, with the chance of each.
	Endpoints []Chance `json:"endpoints,omitempty"`
	// Masquerade is true when every branch that delivers the packet
	// masquerades it (its source becomes this node's address as it
	// leaves).
	Masquerade bool `json:"masquerade"`
	// Affinity says how a client that came before is sent back to the
	// same endpoint; empty without session affinity.
	Affinity string `json:"affinity,omitempty"`
	// Reason says why, in explain's words.
	Reason string `json:"reason,omitempty"`
}

// Chance is one endpoint a new connection may go to.
type Chance struct {
	Endpoint    string  `json:"endpoint"`
	Probability float64 `json:"probability"`
	Masquerade  bool    `json:"masquerade"`
}

// Verification is what a check of the kernel found.
type Verification struct {
	// Differences is empty when the kernel holds what the trace walked.
	Differences []string `json:"differences"`
	Error       string   `json:"error,omitempty"`
}

// Mixed is the outcome's verdict when branches end differently.
const Mixed Verdict = "mixed"

// SetBranches records the ways the packet can end: the steps they share
// go to Steps, and the outcome sums them up.
func (r *Result) SetBranches(branches []Branch) {
	r.Branches = branches
	r.Steps = commonSteps(branches)
	for i := range r.Branches {
		r.Branches[i].Steps = r.Branches[i].Steps[len(r.Steps):]
	}
	// A mark on a packet that is dropped or rejected masquerades nothing.
	delivered := func(b Branch) bool { return b.Verdict != Drop && b.Verdict != Reject }
	r.Outcome.Masquerade = slices.ContainsFunc(branches, delivered)
	r.Outcome.Endpoints = nil
	for i, b := range branches {
		if i == 0 {
			r.Outcome.Verdict = b.Verdict
		} else if b.Verdict != r.Outcome.Verdict {
			r.Outcome.Verdict = Mixed
		}
		if delivered(b) {
			r.Outcome.Masquerade = r.Outcome.Masquerade && b.Masquerade
		} else {
			r.Branches[i].Masquerade = false
		}
		if b.Verdict == DNAT {
			r.Outcome.Endpoints = append(r.Outcome.Endpoints, Chance{Endpoint: b.Endpoint, Probability: b.Probability, Masquerade: b.Masquerade})
		}
	}
	slices.SortStableFunc(r.Outcome.Endpoints, func(a, b Chance) int { return cmp.Compare(a.Endpoint, b.Endpoint) })
}

func commonSteps(branches []Branch) []Step {
	if len(branches) == 0 {
		return []Step{}
	}
	n := len(branches[0].Steps)
	for _, b := range branches[1:] {
		n = min(n, len(b.Steps))
		for i := 0; i < n; i++ {
			if b.Steps[i] != branches[0].Steps[i] {
				n = i
				break
			}
		}
	}
	return slices.Clone(branches[0].Steps[:n])
}
