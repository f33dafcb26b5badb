package ipvs

import "testing"

func TestIsKubeProxySet(t *testing.T) {
	for name, want := range map[string]bool{
		"KUBE-CLUSTER-IP": true, "KUBE-6-CLUSTER-IP": true, "KUBE-NODE-PORT-LOCAL-SCTP-HASH": true,
		"KUBE-6-LOAD-BALANCER-SOURCE-CID": true, "KUBE-SOMETHING": false, "cali40all-ipam-pools": false, "CLUSTER-IP": false,
	} {
		if got := IsKubeProxySet(name); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
}
