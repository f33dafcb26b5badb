package framework

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// HasNATChain tells whether the namespace's IPv4 nat table holds chain,
// asking the backend's tools about that one chain only: with nft that
// stays cheap at any table size, unlike iptables-save or `nft monitor`
// (which at 10,000 services does not keep up at all).
func (n *Netns) HasNATChain(b IPTablesBackend, chain string) bool {
	return n.Command("iptables-"+string(b), "-w", "-t", "nat", "-S", chain).Run() == nil
}

// NATChains lists the chains of the namespace's IPv4 nat table with one
// iptables-save. With iptables-legacy that costs what listing one chain
// does, a copy of the whole table, so it is the way to look for many.
func (n *Netns) NATChains(b IPTablesBackend) (map[string]bool, error) {
	out, err := n.Command("iptables-"+string(b)+"-save", "-t", "nat").Output()
	if err != nil {
		return nil, fmt.Errorf("iptables-%s-save -t nat: %w", b, err)
	}
	chains := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if rest, ok := strings.CutPrefix(line, ":"); ok {
			name, _, _ := strings.Cut(rest, " ")
			chains[name] = true
		}
	}
	return chains, nil
}

// EndpointChain is the KUBE-SEP chain kube-proxy (upstream's and ours)
// gives an endpoint ("ip:port") of a service port: the first 16
// characters of base32(sha256("namespace/name:port" + protocol + endpoint)).
// Its appearance means the endpoint's DNAT rule is in the kernel: a
// restore adds the chain and its rules at once.
func EndpointChain(namespace, service, port, protocol, endpoint string) string {
	return "KUBE-SEP-" + chainHash(namespace+"/"+service+":"+port+protocol+endpoint)
}

// ServiceChain is a service port's KUBE-SVC chain, hashed the same way.
func ServiceChain(namespace, service, port, protocol string) string {
	return "KUBE-SVC-" + chainHash(namespace+"/"+service+":"+port+protocol)
}

func chainHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return base32.StdEncoding.EncodeToString(sum[:])[:16]
}

// NFTablesServiceChain is a service port's chain in the nftables mode
// (upstream's and ours): "service-HASH-ns/name/protocol/port", HASH being
// the first 8 characters of base32(sha256) of what follows it. Upstream
// cuts a name beyond nft's limit (256); the benchmark's are far shorter.
func NFTablesServiceChain(namespace, service, port, protocol string) string {
	return "service-" + nftablesHashed(nftablesServiceBase(namespace, service, port, protocol))
}

func nftablesServiceBase(namespace, service, port, protocol string) string {
	return namespace + "/" + service + "/" + strings.ToLower(protocol) + "/" + port
}

func nftablesHashed(base string) string {
	sum := sha256.Sum256([]byte(base))
	return base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + base
}

// TableRule is one rule of an nftables table as `nft -a` lists it:
// its text, without counters, and its handle.
type TableRule struct {
	Text   string
	Handle string
}

// TableRules lists an nftables table of the namespace (the iptables-nft
// tables are nftables tables too: "ip nat") chain by chain; a set or a
// map is listed as its lines, sorted. A rule written again gets a new
// handle, so two listings tell which chains were rewritten in between,
// and their texts whether the table holds the same rules.
func (n *Netns) TableRules(family, table string) (map[string][]TableRule, error) {
	out, err := n.Command("nft", "-a", "list", "table", family, table).Output()
	if err != nil {
		return nil, fmt.Errorf("nft -a list table %s %s: %w", family, table, err)
	}
	return parseTableRules(string(out)), nil
}

// parseTableRules reads `nft -a list table` output; a set's or a map's
// elements, which nft wraps in lines as they fit, are taken one by one.
func parseTableRules(out string) map[string][]TableRule {
	rules := map[string][]TableRule{}
	var block string
	var sorted bool
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		text, handle, _ := strings.Cut(line, " # handle ")
		text = counters.ReplaceAllString(text, "")
		f := strings.Fields(text)
		switch {
		case len(f) >= 3 && (f[0] == "chain" || f[0] == "set" || f[0] == "map") && f[len(f)-1] == "{":
			block, sorted = f[0]+" "+f[1], f[0] != "chain"
			rules[block] = []TableRule{}
		case text == "}":
			if sorted {
				slices.SortFunc(rules[block], func(a, b TableRule) int { return strings.Compare(a.Text, b.Text) })
			}
			block = ""
		case block != "" && sorted:
			text = strings.TrimSuffix(strings.TrimPrefix(text, "elements = {"), "}")
			for _, item := range strings.Split(text, ",") {
				if item = strings.TrimSpace(item); item != "" {
					rules[block] = append(rules[block], TableRule{Text: item})
				}
			}
		case block != "" && text != "":
			rules[block] = append(rules[block], TableRule{Text: text, Handle: handle})
		}
	}
	return rules
}

// counters are what traffic changes in a listed rule.
var counters = regexp.MustCompile(`counter packets \d+ bytes \d+ ?`)
