package ipvs

import (
	"io"
	"os/exec"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/iptables"
	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// countingIPTables counts the restores a chain sync makes.
type countingIPTables struct {
	iptables.Kernel
	restores int
	last     string
}

func (k *countingIPTables) Restore(in io.Reader) error {
	k.restores++
	b, _ := io.ReadAll(in)
	k.last = string(b)
	return k.Kernel.Restore(strings.NewReader(k.last))
}

// The mode's chains go through both iptables backends and come back the
// same: a restart over them (ours or upstream's, which are the same
// rules) writes nothing, and a first start removes what the iptables
// mode left. The KUBE-IPVS-OUT-FILTER rule needs the ipvs match, which
// only the VM's kernel has.
func TestChainsRoundTripThroughTheKernel(t *testing.T) {
	testutil.RequireCommands(t, "iptables-legacy-restore", "iptables-nft-restore", "ipset")
	var variants [][2]string
	for _, b := range []iptables.Backend{iptables.NFT, iptables.Legacy} {
		variants = append(variants, [2]string{string(b) + " backend", iptables.BackendEnv + "=" + string(b)})
	}
	if !testutil.RerunInNetns(t, variants) {
		return
	}
	backend, _, err := iptables.DetectBackend()
	if err != nil {
		t.Fatal(err)
	}
	p := testParams(t, false)
	for _, s := range p.Sets() {
		args := []string{"create", s.Name, string(s.Type)}
		if s.Type == ipvskernel.BitmapPort {
			args = append(args, "range", "0-65535")
		}
		if out, err := exec.Command("ipset", args...).CombinedOutput(); err != nil {
			t.Fatalf("ipset %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	t.Cleanup(func() { _ = exec.Command("ipset", "destroy").Run() })
	real := iptables.New(false, backend)
	// What the iptables mode leaves: a service chain, the shared chains
	// jumping to it, and its jumps from the built-in chains.
	leftovers := `*filter
:KUBE-EXTERNAL-SERVICES - [0:0]
-I INPUT 1 -m conntrack --ctstate NEW -m comment --comment "kubernetes externally-visible service portals" -j KUBE-EXTERNAL-SERVICES
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -j KUBE-SVC-ABCDEFGHIJKLMNOP
-A KUBE-SVC-ABCDEFGHIJKLMNOP -p tcp -j DNAT --to-destination 10.244.0.5:80
-I PREROUTING 1 -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
COMMIT
`
	if err := real.Restore(strings.NewReader(leftovers)); err != nil {
		t.Fatal(err)
	}
	all := func(string) bool { return true }
	chains := p.Chains(all, nil)
	if err := iptables.NewChainSet(real).Sync(chains, Jumps(), true); err != nil {
		t.Fatal(err)
	}
	var save strings.Builder
	if err := real.Save(func(r io.Reader) error {
		_, err := io.Copy(&save, r)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"KUBE-SVC-ABCDEFGHIJKLMNOP", "KUBE-EXTERNAL-SERVICES", "10.96.0.1"} {
		if strings.Contains(save.String(), gone) {
			t.Errorf("%s: %s is still there after the first sync:\n%s", backend, gone, save.String())
		}
	}
	if n := strings.Count(save.String(), `--comment "kubernetes service portals" -j KUBE-SERVICES`); n != 2 {
		t.Errorf("%s: %d jumps to KUBE-SERVICES, want the two of nat OUTPUT and PREROUTING:\n%s", backend, n, save.String())
	}

	restarted := &countingIPTables{Kernel: real}
	if err := iptables.NewChainSet(restarted).Sync(chains, Jumps(), true); err != nil {
		t.Fatal(err)
	}
	if restarted.restores != 0 {
		t.Errorf("%s: a restart over the same chains wrote %d restores, want none:\n%s", backend, restarted.restores, restarted.last)
	}
	// A set becoming empty rewrites the chains that match it, and only
	// when it changes.
	chainSet := iptables.NewChainSet(restarted)
	if err := chainSet.Sync(chains, Jumps(), true); err != nil {
		t.Fatal(err)
	}
	noLB := p.Chains(func(s string) bool { return s != setLoadBalancer }, nil)
	for range 2 {
		if err := chainSet.Sync(noLB, Jumps(), false); err != nil {
			t.Fatal(err)
		}
	}
	if restarted.restores != 1 {
		t.Errorf("%s: %d restores for one change of the chains, want 1", backend, restarted.restores)
	}
}
