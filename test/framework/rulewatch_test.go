package framework

import (
	"reflect"
	"testing"
)

func TestEndpointChain(t *testing.T) {
	// The example of the project's kube-proxy facts.
	if got := EndpointChain("ns1", "svc1", "p80", "tcp", "10.180.0.1:80"); got != "KUBE-SEP-SXIVWICOYRO3J4NJ" {
		t.Errorf("EndpointChain = %s, want KUBE-SEP-SXIVWICOYRO3J4NJ", got)
	}
}

func TestNFTablesServiceChain(t *testing.T) {
	// A name upstream's nftables mode wrote (upstream's tests).
	if got := NFTablesServiceChain("ns1", "svc1", "p80", "TCP"); got != "service-ULMVA6XW-ns1/svc1/tcp/p80" {
		t.Errorf("NFTablesServiceChain = %s, want service-ULMVA6XW-ns1/svc1/tcp/p80", got)
	}
}

func TestParseTableRules(t *testing.T) {
	out := `table ip kube-proxy { # comment "rules for kube-proxy"
	map service-ips { # handle 4
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.2 . tcp . 80 : goto service-B,
			     10.96.0.1 . tcp . 80 : goto service-A }
	}

	chain service-A { # handle 9
		ip daddr 10.96.0.1 tcp dport 80 ip saddr != 10.244.0.0/16 counter packets 3 bytes 180 jump mark-for-masquerade # handle 10
		numgen random mod 1 vmap { 0 : goto endpoint-X } # handle 11
	}
}`
	got := parseTableRules(out)
	want := map[string][]TableRule{
		"map service-ips": {
			{Text: "10.96.0.1 . tcp . 80 : goto service-A"},
			{Text: "10.96.0.2 . tcp . 80 : goto service-B"},
			{Text: "type ipv4_addr . inet_proto . inet_service : verdict"},
		},
		"chain service-A": {
			{Text: "ip daddr 10.96.0.1 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade", Handle: "10"},
			{Text: "numgen random mod 1 vmap { 0 : goto endpoint-X }", Handle: "11"},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}
