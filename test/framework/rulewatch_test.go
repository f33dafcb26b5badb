package framework

import "testing"

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
