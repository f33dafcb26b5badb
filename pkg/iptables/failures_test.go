package iptables

import (
	"errors"
	"io"
	"testing"

	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// refusingKernel refuses its next refusals restores, as iptables-restore
// does an input with a bad line.
type refusingKernel struct {
	recordingKernel
	refusals int
}

func (k *refusingKernel) Restore(input io.Reader) error {
	if k.refusals == 0 {
		return k.recordingKernel.Restore(input)
	}
	k.refusals--
	io.Copy(io.Discard, input)
	return errors.New("iptables-restore: line 2 failed")
}

// restoreFailures are the IPv4 family's counts of failed full and
// partial restores.
func restoreFailures(t *testing.T) (full, partial float64) {
	t.Helper()
	var m dto.Metric
	if err := metrics.IPTablesRestoreFailuresTotal.WithLabelValues(string(v1.IPv4Protocol)).Write(&m); err != nil {
		t.Fatal(err)
	}
	full = m.GetCounter().GetValue()
	if err := metrics.IPTablesPartialRestoreFailuresTotal.WithLabelValues(string(v1.IPv4Protocol)).Write(&m); err != nil {
		t.Fatal(err)
	}
	return full, m.GetCounter().GetValue()
}

// As upstream, a failed restore is counted, a full one apart from a
// partial one; a full sync the nfacct objects stop sends no restore and
// is not counted.
func TestFailedRestoresAreCountedByKind(t *testing.T) {
	detector, err := localdetect.New(localdetect.Settings{Mode: "ClusterCIDR", CIDRs: []string{"10.244.0.0/16"}}, v1.IPv4Protocol)
	if err != nil {
		t.Fatal(err)
	}
	kernel := &refusingKernel{}
	var nfacctErr error
	p := newProxier(Config{
		Family: v1.IPv4Protocol, Kernel: kernel,
		Params:       Params{MasqueradeBit: 14, LocalDetector: detector, NFAcct: true},
		EnsureNFAcct: func() error { return nfacctErr },
	}, "node-1")
	feed(p, 2)
	counted := func(why string, wantFull, wantPartial float64) {
		t.Helper()
		full, partial := restoreFailures(t)
		if full != wantFull || partial != wantPartial {
			t.Errorf("%s: %v full and %v partial restore failures counted, want %v and %v", why, full, partial, wantFull, wantPartial)
		}
	}
	full, partial := restoreFailures(t)

	nfacctErr = errors.New("nfacct: operation not permitted")
	if err := p.sync(); !errors.Is(err, errNFAcct) {
		t.Fatalf("sync returned %v, want the nfacct objects' error", err)
	}
	counted("a full sync stopped by the nfacct objects", full, partial)

	nfacctErr, kernel.refusals = nil, 1
	if err := p.sync(); err == nil {
		t.Fatal("a full sync whose restore was refused succeeded")
	}
	counted("a refused full restore", full+1, partial)

	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	// The partial sync's restore is refused; the full sync after it goes
	// through.
	feedService(p, 5)
	kernel.refusals = 1
	if err := p.sync(); err != nil {
		t.Fatal(err)
	}
	counted("a refused partial restore", full+1, partial+1)
}
