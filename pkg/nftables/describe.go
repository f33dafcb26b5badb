package nftables

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Describe names the service port's chains, affinity sets and elements of
// the shared sets and maps, as ServiceObjects decides them now, and
// returns a check of just those against the kernel.
func (s *Syncer) Describe(v state.View, name state.ServicePortName) ([]proxy.KernelObject, func() ([]string, error)) {
	svc, sel, ok := v.Select(name)
	if !ok {
		return nil, nil
	}
	s.mu.Lock()
	want := s.cfg.Params.ServiceObjects(svc, sel)
	s.mu.Unlock()
	// Endpoint chains and affinity sets are named by a hash: say where
	// each leads.
	endpoints := map[string]string{}
	for _, ep := range sel.All {
		base := endpointBase(name, ep)
		endpoints[prefixEndpoint+base] = ep.String()
		endpoints[prefixAffinity+base] = ep.String()
	}
	table := string(Family(s.cfg.Family)) + " " + TableName + " "
	var objects []proxy.KernelObject
	for _, c := range want.Chains {
		summary := fmt.Sprintf("%d rules", len(c.Rules))
		if len(c.Rules) == 1 {
			summary = "1 rule"
		}
		if ep, ok := endpoints[c.Name]; ok {
			summary += ", to " + ep
		}
		objects = append(objects, proxy.KernelObject{Kind: "chain", Name: table + c.Name, Summary: summary, Content: c.Rules})
	}
	for _, st := range want.Sets {
		objects = append(objects, proxy.KernelObject{Kind: "set", Name: table + st.Name,
			Summary: "clients sent to " + endpoints[st.Name] + ", for " + nftnl.Duration(st.Timeout)})
	}
	for _, e := range want.Elements {
		kind := "set element"
		if e.Map != "" {
			kind = "map element"
		}
		id := idOf(e)
		objects = append(objects, proxy.KernelObject{Kind: kind, Name: id.container + " " + id.key, Summary: strings.Join(e.Value, " . ")})
	}
	return objects, func() ([]string, error) { return s.verify(name, want) }
}

// verify lists how the kernel differs from one service port's objects:
// its chains, its sets, and each shared set or map it has elements in,
// each read once (see reader). Rules and elements compare as a full sync
// compares them.
func (s *Syncer) verify(name state.ServicePortName, want ServiceObjects) ([]string, error) {
	byContainer := map[string][]knftables.Element{}
	for _, m := range serviceMaps {
		byContainer[m] = nil // read even when the port wants nothing there now
	}
	for _, e := range want.Elements {
		byContainer[e.Set+e.Map] = append(byContainer[e.Set+e.Map], e)
	}
	containers := slices.Sorted(maps.Keys(byContainer))
	read := s.reader(context.TODO(), want, containers)
	table := string(Family(s.cfg.Family)) + " " + TableName + " "
	var differences []string
	for _, c := range want.Chains {
		t, err := read("chain", c.Name)
		if err != nil {
			return differences, err
		}
		have, ok := t.chains[c.Name]
		if !ok {
			differences = append(differences, "chain "+table+c.Name+" is missing")
			continue
		}
		if c.Upstream != nil && sameRules(have.Rules, c.Upstream) {
			continue // upstream's form of the same rules, which a sync keeps
		}
		differences = append(differences, proxy.RuleDifferences("chain "+table+c.Name, c.Rules, have.Rules, normalizeSets)...)
	}
	for _, st := range want.Sets {
		t, err := read(kindOf(st.Map), st.Name)
		if err != nil {
			return differences, err
		}
		switch have, ok := t.sets[st.Name]; {
		case !ok:
			differences = append(differences, kindOf(st.Map)+" "+table+st.Name+" is missing")
		case !sameSet(have.Set, st):
			differences = append(differences, fmt.Sprintf("%s %s%s is %s, want %s", kindOf(st.Map), table, st.Name, settings(have.Set), settings(st)))
		}
	}
	owned := ownedValues(name)
	for _, container := range containers {
		elements := byContainer[container]
		isMap := slices.Contains(serviceMaps, container) || elements[0].Map != ""
		t, err := read(kindOf(isMap), container)
		if err != nil {
			return differences, err
		}
		have, ok := t.sets[container]
		if !ok {
			if len(elements) > 0 {
				differences = append(differences, kindOf(isMap)+" "+table+container+" is missing")
			}
			continue
		}
		differences = append(differences, elementDifferences(have, elements, owned, name.String())...)
	}
	return differences, nil
}

// serviceMaps hold elements of every service port, each under the port's
// name as comment; verify reads each of them, so an element a port left
// in a map it no longer uses (a stale no-endpoint verdict, say) is found.
var serviceMaps = []string{mapServiceIPs, mapServiceNodePorts, mapNoEndpointServices, mapNoEndpointNodePorts, mapFirewallIPs}

// reader reads one chain, set or map for verify: from one read of the
// port's chains, its sets and the containers of its elements
// (Kernel.ReadObjects, over netlink), which costs what they hold; or,
// when that fails, with nft: alone, or from one listing of the whole
// table when the port has several chains. To list any chain nft (1.0.6)
// fetches every anonymous set of the table, the numgen maps of all
// services: at 10k services one chain costs nearly what the whole table
// does (2.8 s against 3.3 s), while a set or map alone costs little
// (0.15 s for service-ips).
func (s *Syncer) reader(ctx context.Context, want ServiceObjects, containers []string) func(kind, name string) (*table, error) {
	var chains, sets []string
	for _, c := range want.Chains {
		chains = append(chains, c.Name)
	}
	for _, st := range want.Sets {
		sets = append(sets, st.Name)
	}
	kernel := s.cfg.Kernel
	read, err := kernel.ReadObjects(ctx, chains, append(sets, containers...))
	if err == nil {
		return func(string, string) (*table, error) { return read, nil }
	}
	if !errors.Is(err, errNotOverNetlink) {
		klog.V(2).InfoS("Cannot read a service port's objects over netlink; listing them with nft instead", "ipFamily", s.cfg.Family, "err", err)
	}
	if len(want.Chains) <= 1 {
		return func(kind, name string) (*table, error) { return kernel.List(ctx, kind, name) }
	}
	var t *table
	return func(string, string) (*table, error) {
		var err error
		if t == nil {
			t, err = kernel.List(ctx, "table", "")
		}
		return t, err
	}
}

// elementDifferences lists the wanted elements a set or map lacks or maps
// to another value, and its elements that lead to the service port's
// chains (owned) or carry its name as their comment but are not wanted.
func elementDifferences(have *tableSet, want []knftables.Element, owned map[string]bool, comment string) []string {
	var out []string
	wanted := map[string]bool{}
	for _, e := range want {
		id := idOf(e)
		wanted[id.key] = true
		value := strings.Join(e.Value, " . ")
		switch hv, ok := have.elements[id.key]; {
		case !ok && have.Map:
			out = append(out, fmt.Sprintf("map %s: element %s : %s is missing", have.Name, id.key, value))
		case !ok:
			out = append(out, fmt.Sprintf("set %s: element %s is missing", have.Name, id.key))
		case hv != value:
			out = append(out, fmt.Sprintf("map %s: element %s maps to %s instead of %s", have.Name, id.key, hv, value))
		}
	}
	for _, key := range slices.Sorted(maps.Keys(have.elements)) {
		value := have.elements[key]
		if !wanted[key] && (owned[value] || have.comments[key] == comment) {
			out = append(out, fmt.Sprintf("map %s: element %s : %s is unexpected", have.Name, key, value))
		}
	}
	return out
}

// ownedValues are the verdicts that lead to one service port's chains.
func ownedValues(name state.ServicePortName) map[string]bool {
	n := namesFor(name)
	return map[string]bool{n.gotoCluster: true, n.gotoLocal: true, n.gotoExternal: true, n.gotoFirewall: true}
}

func kindOf(isMap bool) string {
	if isMap {
		return "map"
	}
	return "set"
}

// settings are what a sync compares of a set, as words.
func settings(st Set) string {
	s := "type " + st.Type
	if len(st.Flags) > 0 {
		flags := make([]string, len(st.Flags))
		for i, f := range sortedFlags(st.Flags) {
			flags[i] = string(f)
		}
		s += ", flags " + strings.Join(flags, ",")
	}
	if st.Timeout != 0 {
		s += ", timeout " + nftnl.Duration(st.Timeout)
	}
	if st.Comment != "" {
		s += fmt.Sprintf(", comment %q", st.Comment)
	}
	return s
}
