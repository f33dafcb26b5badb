package nftables

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/state"
	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Trace follows a packet through the table a sync writes: the fixed
// chains, sets and maps (Layout) and what the service port it is
// addressed to puts there (ServiceObjects with the endpoints selected
// for this node; svc nil when none). The hooks come in their priority
// order: the firewall check before DNAT, the DNAT, then, for what no
// DNAT took, the filter chain of the input, forward or output hook.
// clusterIPs are every service's cluster IPs (the cluster-ips set).
func (p *Params) Trace(svc *state.ServicePort, sel state.Selection, clusterIPs []netip.Addr, pkt trace.Packet) ([]trace.Branch, error) {
	rs := &traceTable{params: p, packet: pkt, chains: map[string][]string{}, elements: map[string][]knftables.Element{},
		clusterIPs: map[netip.Addr]bool{}}
	layout := p.Layout()
	for _, c := range layout.Chains {
		rs.chains[c.Name] = c.Rules
	}
	rs.addElements(layout.Elements)
	if svc != nil {
		objects := p.ServiceObjects(svc, sel)
		for _, c := range objects.Chains {
			rs.chains[c.Name] = c.Rules
		}
		rs.addElements(objects.Elements)
	}
	for _, a := range clusterIPs {
		rs.clusterIPs[a] = true
	}
	hooks := []string{chainFilterPreroutingPreDNAT, chainNATPrerouting, chainFilterForward}
	switch {
	case pkt.From == trace.FromNode:
		hooks = []string{chainFilterOutputPreDNAT, chainNATOutput, chainFilterOutput}
	case pkt.LocalDestination:
		hooks[2] = chainFilterInput
	}
	prefix := p.ipX() + " " + TableName + " "
	branches := []trace.Branch{{Probability: 1, Verdict: trace.PassedOn}}
	for _, hook := range hooks {
		var next []trace.Branch
		for _, b := range branches {
			if b.Verdict != trace.PassedOn {
				next = append(next, b)
				continue
			}
			walked, err := trace.Walk(rs, prefix, hook)
			if err != nil {
				return nil, err
			}
			next = append(next, trace.Extend(b, walked)...)
		}
		branches = next
	}
	// Postrouting: a pod sent to itself is masqueraded through the
	// hairpin set, so that the answer comes back through the node.
	for i, b := range branches {
		if b.Verdict != trace.DNAT {
			continue
		}
		to := netip.MustParseAddrPort(b.Endpoint)
		key := []string{pkt.Source.String(), to.Addr().String(), packetProto(pkt), strconv.Itoa(int(to.Port()))}
		if rs.inSet(setHairpinConnections, key) {
			branches[i].Masquerade = true
			branches[i].Steps = append(branches[i].Steps, trace.Step{Where: prefix + chainMasquerading, What: hairpinRule(rs.chains[chainMasquerading]),
				Note: "the source is the endpoint: masqueraded through @" + setHairpinConnections})
		}
	}
	return branches, nil
}

// hairpinRule is the masquerading chain's rule for hairpin connections.
func hairpinRule(rules []string) string {
	for _, r := range rules {
		if strings.Contains(r, "@"+setHairpinConnections) {
			return r
		}
	}
	return "@" + setHairpinConnections
}

// inSet tells whether a set holds an element of key.
func (t *traceTable) inSet(set string, key []string) bool {
	for _, e := range t.elements[set] {
		if strings.Join(e.Key, " ") == strings.Join(key, " ") {
			return true
		}
	}
	return false
}

type traceTable struct {
	params     *Params
	packet     trace.Packet
	chains     map[string][]string
	elements   map[string][]knftables.Element
	clusterIPs map[netip.Addr]bool
}

func (t *traceTable) addElements(elements []knftables.Element) {
	for _, e := range elements {
		t.elements[e.Set+e.Map] = append(t.elements[e.Set+e.Map], e)
	}
}

func (t *traceTable) Rules(chain string) ([]string, bool) {
	rules, ok := t.chains[chain]
	return rules, ok
}

// Eval tells whether a rule matches the first packet of a new connection
// and what it does. It knows the expressions and statements this mode
// writes; any other is an error rather than a guess.
func (t *traceTable) Eval(chain, rule string) (bool, trace.Effect, error) {
	r := &ruleEval{t: t, pkt: t.packet, ip: t.params.ipX(), tokens: tokenize(rule)}
	for r.i < len(r.tokens) {
		step, err := r.step()
		if err != nil {
			return false, r.e, err
		}
		if step != evalNext {
			return step == evalMatch, r.e, nil
		}
	}
	return true, r.e, nil
}

// ruleEval reads one rule, an expression or statement at a time, from
// tokens[i], gathering what it does in e.
type ruleEval struct {
	t      *traceTable
	pkt    trace.Packet
	ip     string
	tokens []string
	i      int
	e      trace.Effect
}

// evalStep is what reading an expression or statement gave: go on with
// the next, or the rule matched, or it did not.
type evalStep int

const (
	evalNext evalStep = iota
	evalMatch
	evalNoMatch
)

// matchedIf ends the rule: matched or not.
func matchedIf(matched bool) evalStep {
	if matched {
		return evalMatch
	}
	return evalNoMatch
}

// next is the token n after the current one; "" past the end.
func (r *ruleEval) next(n int) string {
	if r.i+n < len(r.tokens) {
		return r.tokens[r.i+n]
	}
	return ""
}

// skip goes past n tokens.
func (r *ruleEval) skip(n int) (evalStep, error) {
	r.i += n
	return evalNext, nil
}

// step reads the expression or statement at tokens[i].
func (r *ruleEval) step() (evalStep, error) {
	token, rest := r.tokens[r.i], strings.Join(r.tokens[r.i:], " ")
	switch {
	case token == "comment":
		return evalMatch, nil
	case strings.HasPrefix(rest, "ct state new"):
		return r.skip(3)
	case strings.HasPrefix(rest, r.ip+" daddr . meta l4proto . th dport vmap @"):
		return r.vmap(9, []string{r.pkt.Destination.String(), packetProto(r.pkt), packetPort(r.pkt)})
	case strings.HasPrefix(rest, "meta l4proto . th dport vmap @"):
		return r.vmap(6, []string{packetProto(r.pkt), packetPort(r.pkt)})
	case token == r.ip && (r.next(1) == "daddr" || r.next(1) == "saddr"):
		return r.address()
	case strings.HasPrefix(rest, "fib daddr type local"):
		return r.when(r.pkt.LocalDestination, 4)
	case strings.HasPrefix(rest, "fib saddr type local"):
		return r.when(r.pkt.From == trace.FromNode, 4)
	case token == "iifname":
		return r.iifname()
	case strings.HasPrefix(rest, "meta l4proto ") && !strings.HasPrefix(rest, "meta l4proto ."):
		return r.when(strings.EqualFold(r.next(2), string(r.pkt.Protocol)), 3)
	case strings.HasPrefix(rest, "numgen random mod ") && r.next(4) != "map" && r.next(4) != "vmap":
		return r.share(rest)
	case strings.HasPrefix(rest, "meta mark set meta mark | "):
		r.e.Masquerade = true
		return r.skip(7)
	case token == "update":
		return r.update()
	case token == "goto" || token == "jump":
		return r.jump()
	case verdicts[token] != "":
		r.e.Verdict = verdicts[token]
		return r.skip(1)
	case token == "dnat":
		matched, e, err := r.t.dnat(r.tokens[r.i:], r.e)
		r.e = e
		return matchedIf(matched), err
	case token == "numgen":
		return r.numgenVmap()
	}
	return evalNoMatch, fmt.Errorf("the trace does not know %q", rest)
}

// verdicts are the verdict statements that name no chain.
var verdicts = map[string]trace.Verdict{"drop": trace.Drop, "reject": trace.Reject, "accept": trace.Accept, "return": trace.Return}

// when goes past a match of n tokens if it holds, and ends the rule
// otherwise.
func (r *ruleEval) when(holds bool, n int) (evalStep, error) {
	if !holds {
		return evalNoMatch, nil
	}
	return r.skip(n)
}

// vmap ends the rule with the verdict the map named at token at holds
// for key.
func (r *ruleEval) vmap(at int, key []string) (evalStep, error) {
	matched, e, err := r.t.lookup(strings.TrimPrefix(r.tokens[r.i+at], "@"), key)
	r.e = e
	return matchedIf(matched), err
}

// address reads "ip saddr|daddr [!=] value".
func (r *ruleEval) address() (evalStep, error) {
	addr := r.pkt.Destination
	if r.next(1) == "saddr" {
		addr = r.pkt.Source
	}
	r.i += 2
	negate := r.next(0) == "!="
	if negate {
		r.i++
	}
	in, n, err := r.t.member(r.tokens[r.i:], addr)
	if err != nil {
		return evalNoMatch, err
	}
	return r.when(in != negate, n)
}

// iifname reads "iifname [!=] name". Only the local-traffic detector
// matches interfaces: those of this node's pods.
func (r *ruleEval) iifname() (evalStep, error) {
	negate := r.next(1) == "!="
	if negate {
		r.i++
	}
	return r.when((r.pkt.From == trace.FromPod) != negate, 2)
}

// share reads "numgen random mod N 0": the rule takes 1/N of what
// reaches it.
func (r *ruleEval) share(rest string) (evalStep, error) {
	n, err := strconv.Atoi(r.next(3))
	if err != nil || n < 1 || r.next(4) != "0" {
		return evalNoMatch, fmt.Errorf("numgen %q", rest)
	}
	r.e.Share = 1 / float64(n)
	return r.skip(5)
}

// update adds the client to an affinity set: nothing a trace follows.
func (r *ruleEval) update() (evalStep, error) {
	for r.i < len(r.tokens) && r.tokens[r.i] != "}" {
		r.i++
	}
	return r.skip(1)
}

// jump reads "goto|jump chain".
func (r *ruleEval) jump() (evalStep, error) {
	r.e.Verdict, r.e.Chain = trace.Goto, r.next(1)
	if r.tokens[r.i] == "jump" {
		r.e.Verdict = trace.Jump
	}
	return r.skip(2)
}

// numgenVmap reads "numgen random mod N vmap { 0 : goto a, 1 : goto b }":
// a fork to each chain.
func (r *ruleEval) numgenVmap() (evalStep, error) {
	entries, err := mapEntries(r.tokens[r.i+5:])
	if err != nil {
		return evalNoMatch, err
	}
	for _, v := range entries {
		f := r.e
		f.Verdict, f.Chain = trace.Goto, strings.TrimPrefix(v, "goto ")
		r.e.Fork = append(r.e.Fork, f)
	}
	return evalMatch, nil
}

// dnat reads "dnat to A:P", or "dnat ip to numgen random mod N map {
// 0 : A . P, ... }" (upstream's form, and ours above cascadeLimit).
func (t *traceTable) dnat(tokens []string, e trace.Effect) (bool, trace.Effect, error) {
	if len(tokens) >= 3 && tokens[1] == "to" {
		to, err := netip.ParseAddrPort(tokens[2])
		if err != nil {
			return false, e, fmt.Errorf("dnat to %q", tokens[2])
		}
		e.Verdict, e.To = trace.DNAT, to
		return true, e, nil
	}
	if len(tokens) < 8 || tokens[3] != "numgen" {
		return false, e, fmt.Errorf("the trace does not know %q", strings.Join(tokens, " "))
	}
	entries, err := mapEntries(tokens[8:])
	if err != nil {
		return false, e, err
	}
	for _, v := range entries {
		addr, p, _ := strings.Cut(v, " . ")
		a, err1 := netip.ParseAddr(addr)
		n, err2 := strconv.ParseUint(p, 10, 16)
		if err1 != nil || err2 != nil {
			return false, e, fmt.Errorf("dnat map entry %q", v)
		}
		e.Fork = append(e.Fork, trace.Effect{Verdict: trace.DNAT, To: netip.AddrPortFrom(a, uint16(n)), Masquerade: e.Masquerade})
	}
	return true, e, nil
}

// mapEntries reads "{ 0 : x, 1 : y }" into x, y.
func mapEntries(tokens []string) ([]string, error) {
	text := strings.Join(tokens, " ")
	open, end := strings.Index(text, "{"), strings.LastIndex(text, "}")
	if open < 0 || end < open {
		return nil, fmt.Errorf("an anonymous map in %q", text)
	}
	var out []string
	for _, entry := range strings.Split(text[open+1:end], ",") {
		_, v, ok := strings.Cut(entry, ":")
		if !ok {
			return nil, fmt.Errorf("map entry %q", entry)
		}
		out = append(out, strings.TrimSpace(v))
	}
	return out, nil
}

// member tells whether addr is in what tokens start with (@set, an
// address, prefix or range, or an anonymous set of those) and how many
// tokens that took.
func (t *traceTable) member(tokens []string, addr netip.Addr) (bool, int, error) {
	if len(tokens) == 0 {
		return false, 0, fmt.Errorf("an address match without a value")
	}
	if name, ok := strings.CutPrefix(tokens[0], "@"); ok {
		switch {
		case name == setClusterIPs:
			return t.clusterIPs[addr], 1, nil
		case strings.HasPrefix(name, prefixAffinity):
			// A client seen before goes back to its endpoint; a new one
			// is in no affinity set (session affinity, see the outcome).
			return false, 1, nil
		}
		for _, e := range t.elements[name] {
			if a, err := netip.ParseAddr(e.Key[0]); err == nil && a == addr {
				return true, 1, nil
			}
		}
		return false, 1, nil
	}
	values, n := []string{tokens[0]}, 1
	if tokens[0] == "{" {
		values = nil
		for n = 1; n < len(tokens) && tokens[n] != "}"; n++ {
			values = append(values, strings.TrimSuffix(tokens[n], ","))
		}
		n++
	}
	for _, v := range values {
		in, err := inRange(v, addr)
		if err != nil {
			return false, n, err
		}
		if in {
			return true, n, nil
		}
	}
	return false, n, nil
}

// inRange tells whether addr is v: an address, a prefix or a range.
func inRange(v string, addr netip.Addr) (bool, error) {
	if from, to, ok := strings.Cut(v, "-"); ok {
		f, err1 := netip.ParseAddr(from)
		l, err2 := netip.ParseAddr(to)
		if err1 != nil || err2 != nil {
			return false, fmt.Errorf("address range %q", v)
		}
		return addr.Compare(f) >= 0 && addr.Compare(l) <= 0, nil
	}
	if strings.Contains(v, "/") {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return false, fmt.Errorf("prefix %q", v)
		}
		return p.Contains(addr), nil
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return false, fmt.Errorf("address %q", v)
	}
	return a == addr, nil
}

// lookup is a verdict map's answer for key: its element's verdict, or no
// match when it has none.
func (t *traceTable) lookup(container string, key []string) (bool, trace.Effect, error) {
	var e trace.Effect
	for _, el := range t.elements[container] {
		if len(el.Key) != len(key) || len(el.Value) == 0 {
			continue
		}
		same := true
		for i := range key {
			if a, err := netip.ParseAddr(el.Key[i]); err == nil {
				same = same && a.String() == key[i]
			} else {
				same = same && strings.EqualFold(el.Key[i], key[i])
			}
		}
		if !same {
			continue
		}
		v := el.Value[0]
		e.Note = "element " + strings.Join(el.Key, " . ") + " : " + v + " of @" + container
		switch {
		case strings.HasPrefix(v, "goto "):
			e.Verdict, e.Chain = trace.Goto, strings.TrimPrefix(v, "goto ")
		case strings.HasPrefix(v, "jump "):
			e.Verdict, e.Chain = trace.Jump, strings.TrimPrefix(v, "jump ")
		case v == "drop":
			e.Verdict = trace.Drop
		case v == "reject":
			e.Verdict = trace.Reject
		default:
			return false, e, fmt.Errorf("map %s element verdict %q", container, v)
		}
		return true, e, nil
	}
	return false, e, nil
}

// tokenize splits a rule into words, a quoted string and braces each
// being one.
func tokenize(rule string) []string {
	var out []string
	for s := strings.TrimSpace(rule); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			end := strings.IndexByte(s[1:], '"')
			if end < 0 {
				out = append(out, s)
				break
			}
			out = append(out, s[:end+2])
			s = s[end+2:]
			continue
		}
		end := strings.IndexAny(s, " ")
		if end < 0 {
			end = len(s)
		}
		out = append(out, s[:end])
		s = s[end:]
	}
	return out
}

func packetProto(p trace.Packet) string { return strings.ToLower(string(p.Protocol)) }

func packetPort(p trace.Packet) string { return strconv.Itoa(int(p.Port)) }

// Trace follows a packet through the table this node writes now (see
// Params.Trace); the check reads the service port's objects, as an
// explanation's verify does.
func (s *Syncer) Trace(v state.View, name *state.ServicePortName, pkt trace.Packet) ([]trace.Branch, func() ([]string, error), error) {
	var svc *state.ServicePort
	var sel state.Selection
	if name != nil {
		svc, sel, _ = v.Select(*name)
	}
	var clusterIPs []netip.Addr
	for _, sp := range v.Services {
		clusterIPs = append(clusterIPs, sp.ClusterIP)
	}
	s.mu.Lock()
	params := s.cfg.Params
	s.mu.Unlock()
	branches, err := params.Trace(svc, sel, clusterIPs, pkt)
	if err != nil || svc == nil {
		return branches, nil, err
	}
	_, check := s.Describe(v, *name)
	return branches, check, nil
}
