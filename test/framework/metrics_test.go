package framework

import "testing"

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(`# HELP x y
# TYPE kubeproxy_sync_proxy_rules_iptables_total gauge
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv4",table="nat"} 17010
kubeproxy_sync_proxy_rules_iptables_total{ip_family="IPv6",table="nat"} 12
kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="IPv4"} 1.7e+09
process_open_fds 9
odd{v="a \"quoted\", value"} 1 1700000000000
`)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		labels []string
		want   float64
		ok     bool
	}{
		{"kubeproxy_sync_proxy_rules_iptables_total", []string{"table=nat", "ip_family=IPv6"}, 12, true},
		{"kubeproxy_sync_proxy_rules_iptables_total", []string{"ip_family=IPv4"}, 17010, true},
		{"kubeproxy_sync_proxy_rules_last_timestamp_seconds", nil, 1.7e9, true},
		{"process_open_fds", nil, 9, true},
		{"odd", []string{`v=a "quoted", value`}, 1, true},
		{"kubeproxy_sync_proxy_rules_iptables_total", []string{"table=filter"}, 0, false},
	} {
		if got, ok := m.Get(tc.name, tc.labels...); got != tc.want || ok != tc.ok {
			t.Errorf("Get(%s, %v) = %v, %v; want %v, %v", tc.name, tc.labels, got, ok, tc.want, tc.ok)
		}
	}
	if _, err := ParseMetrics("name{a=\"b} 1"); err == nil {
		t.Error("an unterminated label value parsed")
	}
}
