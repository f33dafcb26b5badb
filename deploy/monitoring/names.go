package monitoring

import (
	"fmt"
	"slices"
	"strings"
)

// SeriesNames are the metric names an expression selects, as written (a
// histogram's series by their _bucket, _sum or _count name), sorted. The
// expression is tokenised, not parsed: strings, label matchers ({...}),
// ranges ([...]), numbers, comments, keywords and aggregations, the label lists of by,
// without, on, ignoring and group_left/right, and identifiers followed by
// "(" (functions and aggregations) are skipped; every other identifier is
// a metric name. An unterminated string, matcher or range is an error, so
// a name hidden by one is not silently lost.
func SeriesNames(expr string) ([]string, error) {
	var names []string
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '{' || c == '[':
			end, err := skipGroup(expr, i)
			if err != nil {
				return nil, err
			}
			i = end
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case isDigit(c) || c == '.':
			// 0.99, 5m, 1e-3 (the sign ends it; the digits after are a number again).
			for i < len(expr) && (isIdentChar(expr[i]) || expr[i] == '.') {
				i++
			}
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdentChar(expr[j]) {
				j++
			}
			id, lower := expr[i:j], strings.ToLower(expr[i:j])
			k := j
			for k < len(expr) && strings.ContainsRune(" \t\r\n", rune(expr[k])) {
				k++
			}
			followedByParen := k < len(expr) && expr[k] == '('
			i = j
			switch {
			case groupingKeywords[lower]:
				if followedByParen {
					end, err := skipGroup(expr, k)
					if err != nil {
						return nil, err
					}
					i = end
				}
			case keywords[lower], followedByParen:
			default:
				if !slices.Contains(names, id) {
					names = append(names, id)
				}
			}
		default:
			i++
		}
	}
	slices.Sort(names)
	return names, nil
}

// groupingKeywords take a parenthesised list of label names.
var groupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// keywords are PromQL's other words that are not metric names: binary
// operators, modifiers, the float literals, and the aggregations, which
// PromQL's lexer also takes as keywords (sum by (x) (...) has no "(" after
// sum).
var keywords = map[string]bool{"and": true, "or": true, "unless": true, "atan2": true, "bool": true, "offset": true, "inf": true, "nan": true,
	"sum": true, "avg": true, "min": true, "max": true, "count": true, "group": true, "stddev": true, "stdvar": true,
	"topk": true, "bottomk": true, "quantile": true, "count_values": true, "limitk": true, "limit_ratio": true}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}
func isIdentChar(c byte) bool { return isIdentStart(c) || isDigit(c) }

// skipString returns the index just past the string literal at i; only
// double- and single-quoted strings have escapes.
func skipString(expr string, i int) (int, error) {
	quote := expr[i]
	for j := i + 1; j < len(expr); j++ {
		switch {
		case expr[j] == '\\' && quote != '`':
			j++
		case expr[j] == quote:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unterminated string at %d in %q", i, expr)
}

// skipGroup returns the index just past the bracket that closes the one
// at i, skipping strings and nested brackets.
func skipGroup(expr string, i int) (int, error) {
	closing := map[byte]byte{'(': ')', '{': '}', '[': ']'}
	stack := []byte{closing[expr[i]]}
	for j := i + 1; j < len(expr); j++ {
		switch c := expr[j]; {
		case c == '"' || c == '\'' || c == '`':
			end, err := skipString(expr, j)
			if err != nil {
				return 0, err
			}
			j = end - 1
		case closing[c] != 0:
			stack = append(stack, closing[c])
		case c == stack[len(stack)-1]:
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return j + 1, nil
			}
		}
	}
	return 0, fmt.Errorf("unclosed %q at %d in %q", expr[i], i, expr)
}

// prometheusOwn are the series Prometheus writes itself for each target,
// which no /metrics serves.
var prometheusOwn = []string{"up"}

// ScrapedNames are the series names the rules and the dashboard read from
// kube-proxy's /metrics: every name their expressions select but those
// the rules record and Prometheus' own.
func ScrapedNames() ([]string, error) {
	groups, err := ParseRules(Rules)
	if err != nil {
		return nil, err
	}
	recorded := slices.Clone(prometheusOwn)
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				recorded = append(recorded, r.Record)
			}
		}
	}
	exprs, err := Expressions()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range exprs {
		selected, err := SeriesNames(e)
		if err != nil {
			return nil, err
		}
		for _, name := range selected {
			if !slices.Contains(recorded, name) && !slices.Contains(names, name) {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names, nil
}

// NotServedIn are, per proxy mode, the series of ScrapedNames that mode's
// kube-proxy does not serve, each with the reason: the rules and the
// dashboard cover every mode, and a series of another mode's is absent,
// as upstream's. test/e2e (iptables, nftables) and test/vm (IPVS) check
// that every other series is served and that these are not.
var NotServedIn = map[string]map[string]string{
	"iptables": {
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":    "the nftables mode's transactions",
		"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total": "the nftables mode's stale chains",
		"kubeproxy_sync_proxy_rules_nftables_repairs_total":          "the nftables mode's table",
		"kubeproxy_sync_proxy_rules_ipvs_repairs_total":              "the IPVS mode's kernel state",
	},
	"nftables": {
		"kubeproxy_sync_proxy_rules_iptables_restore_failures_total":         "iptables-restore runs in the iptables and IPVS modes only",
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": "the iptables mode's partial syncs",
		"kubeproxy_sync_proxy_rules_iptables_flush_recoveries_total":         "the iptables mode's rules",
		"kubeproxy_sync_proxy_rules_iptables_total":                          "the iptables mode's rule counts",
		"kubeproxy_sync_proxy_rules_iptables_last":                           "the iptables mode's rule counts",
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":          "the iptables mode's nfacct counters",
		"kubeproxy_iptables_localhost_nodeports_accepted_packets_total":      "the iptables mode's nfacct counters",
		"kubeproxy_sync_proxy_rules_ipvs_repairs_total":                      "the IPVS mode's kernel state",
	},
	// test/vm checks this one (TestIPVSModeWithTraffic/services).
	"ipvs": {
		"kubeproxy_sync_proxy_rules_nftables_sync_failures_total":            "the nftables mode's transactions",
		"kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total":         "the nftables mode's stale chains",
		"kubeproxy_sync_proxy_rules_nftables_repairs_total":                  "the nftables mode's table",
		"kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total": "the iptables mode's partial syncs: the IPVS mode restores its few iptables rules whole",
		"kubeproxy_sync_proxy_rules_iptables_flush_recoveries_total":         "the iptables mode's rules: the IPVS mode counts what it restores in its repairs",
		"kubeproxy_sync_proxy_rules_iptables_total":                          "the iptables mode's rule counts",
		"kubeproxy_sync_proxy_rules_iptables_last":                           "the iptables mode's rule counts",
		"kubeproxy_iptables_ct_state_invalid_dropped_packets_total":          "the iptables mode's nfacct counters",
		"kubeproxy_iptables_localhost_nodeports_accepted_packets_total":      "the iptables mode's nfacct counters",
	},
}

// ServedIn are the series of ScrapedNames a kube-proxy in mode serves:
// all but NotServedIn[mode].
func ServedIn(mode string) ([]string, error) {
	except, ok := NotServedIn[mode]
	if !ok {
		return nil, fmt.Errorf("no list of the series the %q mode does not serve", mode)
	}
	names, err := ScrapedNames()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(names, func(n string) bool { return except[n] != "" }), nil
}
