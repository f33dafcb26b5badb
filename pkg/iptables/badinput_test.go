package iptables

import (
	"io"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/internal/badinput"
	iptableskernel "github.com/rapidproxy/rapidproxy/internal/iptables"
)

// failureKernel counts restores and records every one the kernel
// refuses: a failed partial sync is otherwise hidden by the full sync
// that follows it.
type failureKernel struct {
	iptableskernel.Kernel
	restores int
	failures []error
}

func (k *failureKernel) Restore(input io.Reader) error {
	k.restores++
	err := k.Kernel.Restore(input)
	if err != nil {
		k.failures = append(k.failures, err)
	}
	return err
}

// Every kind of bad object next to good services, through the real
// iptables-restore of each backend and family: a partial sync adding
// them all and a restart's full sync over them are never refused, the
// restart writes nothing, and the good services' chains are in the kernel
// as they would be alone.
func TestBadObjectsNeverBreakTheRestore(t *testing.T) {
	if !runInNetns(t) {
		return
	}
	nfacct := EnsureNFAcctObjects() == nil
	backend, _, err := iptableskernel.DetectBackend()
	if err != nil {
		t.Fatal(err)
	}
	var bad []badinput.Objects
	for _, c := range badinput.Cases() {
		bad = append(bad, c.Objects)
	}
	for _, family := range families {
		kernel := &failureKernel{Kernel: iptableskernel.New(family == v1.IPv6Protocol, backend)}
		p := objectsProxier(t, family, kernel, nfacct, badinput.Good())
		if err := p.sync(); err != nil {
			t.Fatalf("%s %s: the good services alone: %v", backend, family, err)
		}
		for _, o := range bad {
			deliver(p, o)
		}
		if err := p.sync(); err != nil || len(kernel.failures) > 0 {
			t.Fatalf("%s %s: adding the bad objects: %v %v", backend, family, err, kernel.failures)
		}
		restarted := objectsProxier(t, family, kernel, nfacct, append([]badinput.Objects{badinput.Good()}, bad...)...)
		before := kernel.restores
		if err := restarted.sync(); err != nil || len(kernel.failures) > 0 {
			t.Fatalf("%s %s: a restart over them: %v %v", backend, family, err, kernel.failures)
		}
		if kernel.restores != before {
			t.Errorf("%s %s: a restart over the bad objects wrote %d restores, want none", backend, family, kernel.restores-before)
		}

		saved := savedChains(t, savedText(t, kernel))
		// So many endpoints make a large cluster, whose rules have fewer
		// comments: the good chains compare without them.
		canonical := func(rules []string) []string {
			out := make([]string, len(rules))
			for i, r := range uncommented(rules) {
				out[i] = iptableskernel.CanonicalRule(iptableskernel.Rule(r))
			}
			return out
		}
		goodChains := 0
		for key, rules := range restoreChains(firstSync(t, family, nfacct, badinput.Good())) {
			_, chain, _ := strings.Cut(key, " ")
			if !iptableskernel.IsServiceChain(iptableskernel.Chain(chain)) {
				continue
			}
			goodChains++
			var have []string
			for _, r := range saved[iptableskernel.Chain(chain)] {
				have = append(have, string(r))
			}
			if !slices.Equal(canonical(have), canonical(rules)) {
				t.Errorf("%s %s: good chain %s is not in the kernel as written:\n%s\nwant:\n%s", backend, family, chain, strings.Join(have, "\n"), strings.Join(rules, "\n"))
			}
		}
		t.Logf("%s %s: %d good service chains in place next to %d kinds of bad objects", backend, family, goodChains, len(bad))
	}
}
