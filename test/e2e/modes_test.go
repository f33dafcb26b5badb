package e2e

import (
	"net"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Starting in one mode removes what the others left, which would otherwise
// still act on the traffic, as upstream does: the iptables mode removes
// the nftables mode's tables; the nftables mode the iptables and IPVS
// modes' chains (both backends and families), ipsets and kube-ipvs0.
func TestStartRemovesTheOtherModesLeftovers(t *testing.T) {
	for _, tc := range []struct {
		mode      string
		leftovers [][]string
		// checks list what must no longer show any of gone.
		checks [][]string
		gone   []string
	}{{
		mode:      iptablesMode,
		leftovers: [][]string{{"nft", "add", "table", "ip", "kube-proxy"}, {"nft", "add", "table", "ip6", "kube-proxy"}},
		checks:    [][]string{{"nft", "list", "tables"}},
		gone:      []string{"kube-proxy"},
	}, {
		mode: nftablesMode,
		leftovers: [][]string{
			{"iptables-nft", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"iptables-nft", "-t", "nat", "-A", "OUTPUT", "-j", "KUBE-SERVICES"},
			{"iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES"},
			{"ip6tables-nft", "-t", "filter", "-N", "KUBE-FORWARD"},
			{"ipset", "create", "KUBE-CLUSTER-IP", "hash:ip,port"},
			{"ip", "link", "add", "kube-ipvs0", "type", "bridge"},
		},
		checks: [][]string{{"iptables-nft-save"}, {"ip6tables-nft-save"}, {"iptables-legacy-save"}, {"ipset", "list", "-n"}, {"ip", "link"}},
		gone:   []string{"KUBE-", "kube-ipvs0"},
	}} {
		t.Run(tc.mode, func(t *testing.T) {
			// From a node without anything of kube-proxy's, so that the
			// leftovers made here are all there is.
			stopProxy()
			onNode(t, []string{cluster.KubeProxy(), "--cleanup"})
			onNode(t, tc.leftovers...)
			useOurProxy(t, tc.mode)
			for _, check := range tc.checks {
				out, err := cluster.Node.Command(check...).Output()
				if err != nil {
					t.Fatalf("%v: %v", check, err)
				}
				for _, left := range tc.gone {
					if strings.Contains(string(out), left) {
						t.Errorf("after a start in %s mode, %v still shows %s:\n%s", tc.mode, check, left, out)
					}
				}
			}
		})
	}
}

// A node switched from the iptables mode to the nftables mode and back
// serves its services after each start, with nothing left of the mode it
// ran before. Requests may fail during a switch, as with upstream: a
// start removes the other mode's rules before its first sync.
func TestSwitchingBetweenIPTablesAndNFTablesModes(t *testing.T) {
	useOurProxy(t, iptablesMode)
	addPod(t, "switch-a", framework.PodOptions{Labels: map[string]string{"app": "switch"}})
	client := addPod(t, "switch-client", framework.PodOptions{})
	svc := service("switch", "switch", v1.ProtocolTCP)
	svc.Spec.Type = v1.ServiceTypeNodePort
	svc = createService(t, svc)
	serves := func(t *testing.T) {
		t.Helper()
		for _, ip := range svc.Spec.ClusterIPs {
			eventually(t, convergence, "the client pod to "+ip, func() error {
				_, err := answeredBy(client.Netns, "tcp", ip, 80, "switch-a")
				return err
			})
		}
		eventually(t, convergence, "external to the node port", func() error {
			_, err := answeredBy(cluster.External, "tcp", framework.NodeIPv4, svc.Spec.Ports[0].NodePort, "switch-a")
			return err
		})
	}
	serves(t)
	for _, mode := range []string{nftablesMode, iptablesMode} {
		load, err := client.Netns.StartLoad("tcp", net.JoinHostPort(svc.Spec.ClusterIP, "80"), 8*time.Second, 50*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		switchProxy(t, true, mode)
		seen, err := load.Wait()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("switch to %s mode: %s", mode, seen)
		serves(t)
		switch mode {
		case nftablesMode:
			if rules := nodeRules(t); strings.Contains(rules, "KUBE-") {
				t.Errorf("the iptables mode's rules are left in nftables mode:\n%s", rules)
			}
		case iptablesMode:
			if rules := nftablesRules(t); rules != "" {
				t.Errorf("the nftables mode's tables are left in iptables mode:\n%s", rules)
			}
		}
	}
}
