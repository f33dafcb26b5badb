package trace

import (
	"fmt"
	"net/netip"
	"slices"
)

// Verdict is what becomes of a packet, or what a rule does with it.
type Verdict string

const (
	// Continue: the rule matched but the packet goes on to the next
	// rule (a mark, a counter, an affinity entry).
	Continue Verdict = ""
	Jump     Verdict = "jump"
	Goto     Verdict = "goto"
	Return   Verdict = "return"
	// Accept ends the chain's hook for the packet: it goes on unchanged.
	Accept Verdict = "accept"
	Drop   Verdict = "drop"
	Reject Verdict = "reject"
	// DNAT sends the packet to an endpoint.
	DNAT Verdict = "dnat"
	// PassedOn: no rule of the hook decided; the packet goes on as it
	// came (to IPVS, a local socket or the route to its destination).
	PassedOn Verdict = "passed on"
)

// Effect is what one matching rule does.
type Effect struct {
	Verdict Verdict
	// Chain is where a Jump or Goto leads.
	Chain string
	// To is a DNAT's endpoint.
	To netip.AddrPort
	// Masquerade marks the packet to be masqueraded as it leaves.
	Masquerade bool
	// Share, when above 0, is the fraction of the packets reaching the
	// rule that it picks at random (the others go on to the next rule).
	Share float64
	// Note says what the rule text does not: the map element that
	// decided, for one.
	Note string
	// Fork is a rule that picks one of several effects at random, each
	// as likely (a numgen map); Verdict and the rest are then unused.
	Fork []Effect
}

// Ruleset is one mode's chains as the walker sees them: the rules of a
// chain by name, and whether a rule matches the packet and what it does.
type Ruleset interface {
	Rules(chain string) ([]string, bool)
	Eval(chain, rule string) (matched bool, e Effect, err error)
}

// Step is one rule, set or map element, or virtual server the packet
// meets.
type Step struct {
	// Where is the chain, map or object, in the mode's terms ("nat
	// KUBE-SERVICES", "ip kube-proxy services").
	Where string `json:"where"`
	// What is the rule or element that matched, as the mode writes it.
	What string `json:"what"`
	// Note says what it does, when the rule text does not say it plainly.
	Note string `json:"note,omitempty"`
}

// Branch is one way the packet ends: with some probability, after its
// own steps.
type Branch struct {
	Probability float64 `json:"probability"`
	Steps       []Step  `json:"steps,omitempty"`
	Verdict     Verdict `json:"verdict"`
	// Endpoint is where a DNAT sends it.
	Endpoint   string `json:"endpoint,omitempty"`
	Masquerade bool   `json:"masquerade"`
}

// maxDepth bounds the chains a walk enters, against a loop.
const maxDepth = 32

// frame is where a walk resumes when a chain it jumped into returns.
type frame struct {
	chain string
	next  int
	// steps is how many steps the branch had with the jump: a chain
	// that returns having matched nothing leaves its jump out.
	steps int
}

type walker struct {
	rules    Ruleset
	prefix   string
	branches []Branch
}

// Walk follows the packet from the chain start through r, with prefix
// before each chain's name in the steps, and returns every way it can
// end; their probabilities add up to 1. Falling off start, or returning
// from it, ends in PassedOn.
func Walk(r Ruleset, prefix, start string) ([]Branch, error) {
	w := &walker{rules: r, prefix: prefix}
	if err := w.run(start, 0, Branch{Probability: 1}, nil); err != nil {
		return nil, err
	}
	return w.branches, nil
}

func (w *walker) run(chain string, from int, b Branch, stack []frame) error {
	if len(stack) > maxDepth {
		return fmt.Errorf("chain %s: more than %d chains deep", chain, maxDepth)
	}
	rules, ok := w.rules.Rules(chain)
	if !ok {
		return fmt.Errorf("chain %s does not exist", chain)
	}
	for i := from; i < len(rules); i++ {
		matched, e, err := w.rules.Eval(chain, rules[i])
		if err != nil {
			return fmt.Errorf("chain %s, rule %q: %w", chain, rules[i], err)
		}
		if !matched {
			continue
		}
		taken := b
		taken.Steps = append(slices.Clip(b.Steps), Step{Where: w.prefix + chain, What: rules[i], Note: e.Note})
		if len(e.Fork) > 0 {
			for _, f := range e.Fork {
				forked := taken
				forked.Probability = b.Probability / float64(len(e.Fork))
				if _, err := w.apply(chain, i, f, forked, stack, true); err != nil {
					return err
				}
			}
			return nil
		}
		if e.Share > 0 && e.Share < 1 {
			taken.Probability = b.Probability * e.Share
			b.Probability -= taken.Probability
			if _, err := w.apply(chain, i, e, taken, stack, true); err != nil {
				return err
			}
			continue
		}
		done, err := w.apply(chain, i, e, taken, stack, false)
		if err != nil || done {
			return err
		}
		b = taken
		b.Masquerade = b.Masquerade || e.Masquerade
	}
	return w.ret(b, stack)
}

// apply does what a matched rule says; done is true when the branch
// went on elsewhere (or ended), false when it goes on with the next rule.
// A split branch (a random pick) is walked on here even then.
func (w *walker) apply(chain string, i int, e Effect, b Branch, stack []frame, split bool) (done bool, err error) {
	b.Masquerade = b.Masquerade || e.Masquerade
	switch e.Verdict {
	case Continue:
		if split {
			return true, w.run(chain, i+1, b, stack)
		}
		return false, nil
	case Jump:
		return true, w.run(e.Chain, 0, b, append(slices.Clip(stack), frame{chain, i + 1, len(b.Steps)}))
	case Goto:
		return true, w.run(e.Chain, 0, b, stack)
	case Return:
		return true, w.ret(b, stack)
	case DNAT:
		b.Verdict, b.Endpoint = DNAT, e.To.String()
	default:
		b.Verdict = e.Verdict
	}
	w.branches = append(w.branches, b)
	return true, nil
}

// ret ends a chain: the walk resumes in the chain that jumped to it, or
// the packet is passed on.
func (w *walker) ret(b Branch, stack []frame) error {
	if len(stack) == 0 {
		b.Verdict = PassedOn
		w.branches = append(w.branches, b)
		return nil
	}
	top := stack[len(stack)-1]
	if len(b.Steps) == top.steps {
		b.Steps = b.Steps[:top.steps-1]
	}
	return w.run(top.chain, top.next, b, stack[:len(stack)-1])
}

// Extend is b continued by each branch of the walk it went on into (the
// next hook's): after b's steps, with b's chance and masquerade mark.
func Extend(b Branch, next []Branch) []Branch {
	out := make([]Branch, len(next))
	for i, n := range next {
		n.Probability *= b.Probability
		n.Masquerade = n.Masquerade || b.Masquerade
		n.Steps = append(append([]Step{}, b.Steps...), n.Steps...)
		out[i] = n
	}
	return out
}
