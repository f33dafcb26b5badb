package nftables

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	dto "github.com/prometheus/client_model/go"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

func sampleHarness(t *testing.T) *harness {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.apply(sampleObjects()...)
	h.full()
	return h
}

// operations are a transaction's lines.
func operations(tx string) []string {
	return strings.Split(strings.TrimSuffix(tx, "\n"), "\n")
}

// requireTransaction checks the last transaction, operation by operation.
func requireTransaction(t *testing.T, h *harness, want []string) {
	t.Helper()
	if got := strings.Join(operations(h.nft.last()), "\n"); got != strings.Join(want, "\n") {
		t.Errorf("transaction:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

func requireNoTransaction(t *testing.T, h *harness, before int) {
	t.Helper()
	if len(h.nft.txs) != before {
		t.Fatalf("expected no transaction, got:\n%s", h.nft.last())
	}
}

// A restart over our own rules reads the table and writes nothing.
func TestRestartOverOwnRulesWritesNothing(t *testing.T) {
	h := sampleHarness(t)
	before := dump(h.nft.Fake)
	h.syncer = h.newSyncer(v1.IPv4Protocol, v4(nil)(t))
	n := len(h.nft.txs)
	h.full()
	requireNoTransaction(t, h, n)
	if got := dump(h.nft.Fake); got != before {
		t.Errorf("table changed:\n%s", testutil.LineDiff(before, got))
	}
	// And it knows what is there: a change writes only itself.
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.11")))
	h.partial()
	for _, op := range operations(h.nft.last()) {
		if !strings.Contains(op, "fid-b") {
			t.Errorf("partial sync after restart wrote %q", op)
		}
	}
}

// A takeover from upstream's nftables mode, its table in place as
// v1.36.3 wrote it, writes nothing for the same state.
func TestTakeoverFromUpstreamWritesNothing(t *testing.T) {
	sample, err := os.ReadFile(samplePath)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := parseTable(strings.NewReader(sampleTable(t, string(sample), "table ip kube-proxy {")))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.nft.Fake = replay(t, parsed, knftables.IPv4Family)
	h.syncer = h.newSyncer(v1.IPv4Protocol, v4(nil)(t))
	h.apply(sampleObjects()...)
	h.full()
	requireNoTransaction(t, h, 0)
}

// One endpoint change rewrites that service port's chains and elements,
// nothing else: their flushes and rules, the hairpin element.
func TestEndpointChangeWritesOnlyItsService(t *testing.T) {
	h := sampleHarness(t)
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.11"), ep("10.244.1.12", "node=node-2"), ep("10.244.1.15")))
	h.partial()
	want := []string{
		"flush chain ip kube-proxy service-JVAD2WNX-hx-conf/fid-b/tcp/http",
		"flush chain ip kube-proxy local-JVAD2WNX-hx-conf/fid-b/tcp/http",
		"add rule ip kube-proxy service-JVAD2WNX-hx-conf/fid-b/tcp/http meta l4proto tcp numgen random mod 3 0 dnat to 10.244.1.11:8080",
		"add rule ip kube-proxy service-JVAD2WNX-hx-conf/fid-b/tcp/http meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.12:8080",
		"add rule ip kube-proxy service-JVAD2WNX-hx-conf/fid-b/tcp/http meta l4proto tcp dnat to 10.244.1.15:8080",
		"add rule ip kube-proxy local-JVAD2WNX-hx-conf/fid-b/tcp/http meta l4proto tcp numgen random mod 2 0 dnat to 10.244.1.11:8080",
		"add rule ip kube-proxy local-JVAD2WNX-hx-conf/fid-b/tcp/http meta l4proto tcp dnat to 10.244.1.15:8080",
		"add element ip kube-proxy hairpin-connections { 10.244.1.15 . 10.244.1.15 . tcp . 8080 }",
	}
	requireTransaction(t, h, want)
	checkAgainstFreshSync(t, h)
}

// checkAgainstFreshSync compares the table with what one full sync of
// the same state writes into an empty one.
func checkAgainstFreshSync(t *testing.T, h *harness) {
	t.Helper()
	fresh := newHarness(t, v1.IPv4Protocol, h.syncer.cfg.Params)
	fresh.state, fresh.node = h.state, h.node
	fresh.full()
	if want, got := dump(fresh.nft.Fake), dump(h.nft.Fake); want != got {
		t.Errorf("table differs from a fresh sync (- fresh, + this one):\n%s", testutil.LineDiff(want, got))
	}
}

// removeFidA is the sample after a partial sync that removed service
// fid-a, with the syncer's clock at *now, for the test to move.
func removeFidA(t *testing.T) (*harness, *time.Time) {
	h := sampleHarness(t)
	now := time.Unix(1000, 0)
	h.syncer.now = func() time.Time { return now }
	h.tracker.OnService(types.NamespacedName{Namespace: "hx-conf", Name: "fid-a"}, nil)
	h.changed = h.tracker.Apply(h.state).ServicePorts
	h.partial()
	return h, &now
}

// A removed service's chains are flushed in its sync and deleted by a
// later one, a second on; its affinity sets go at once; elements shared
// with another service stay.
func TestRemovalFlushesThenDeletesLater(t *testing.T) {
	h, now := removeFidA(t)
	tx := h.nft.last()
	for _, want := range []string{
		"flush chain ip kube-proxy service-DMA2WJPR-hx-conf/fid-a/tcp/http",
		"flush chain ip kube-proxy endpoint-CGTYD4X7-hx-conf/fid-a/udp/dns__10.244.1.11/8080",
		"delete set ip kube-proxy affinity-J3ASCV4X-hx-conf/fid-a/tcp/http__10.244.1.11/8080",
		"delete element ip kube-proxy cluster-ips { 10.96.10.30 }",
		"delete element ip kube-proxy service-ips { 10.96.10.30 . udp . 53 }",
		"delete element ip kube-proxy hairpin-connections { 10.244.1.13 . 10.244.1.13 . udp . 8080 }",
	} {
		if !strings.Contains(tx, want+"\n") {
			t.Errorf("missing %q in\n%s", want, tx)
		}
	}
	// fid-b's local endpoint 10.244.1.11 keeps its hairpin element.
	for _, kept := range []string{"10.244.1.11 . 10.244.1.11 . tcp . 8080", "delete chain"} {
		if strings.Contains(tx, kept) {
			t.Errorf("%q written too early or wrongly:\n%s", kept, tx)
		}
	}
	if h.nft.Table.Chains["service-DMA2WJPR-hx-conf/fid-a/tcp/http"] == nil {
		t.Fatal("chain deleted in the transaction that flushed it")
	}

	// Within the second nothing more is due: no transaction at all.
	n := len(h.nft.txs)
	h.changed = nil
	h.partial()
	requireNoTransaction(t, h, n)

	if due := h.syncer.NextSync(); !due.Equal(now.Add(staleChainDelay)) {
		t.Errorf("the deletion is due at %v, want a second after the flush", due)
	}
	*now = now.Add(2 * time.Second)
	h.partial()
	requireStaleChainsDeleted(t, h, "fid-a", 8)
	if due := h.syncer.NextSync(); !due.IsZero() {
		t.Errorf("nothing left to delete, but a sync is asked for at %v", due)
	}
	checkAgainstFreshSync(t, h)
}

func cleanupFailures(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.NFTablesCleanupFailuresTotal.WithLabelValues("IPv4").Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// requireStaleChainsDeleted checks that the last transaction deletes n
// chains of the service, and nothing else.
func requireStaleChainsDeleted(t *testing.T, h *harness, service string, n int) {
	t.Helper()
	var deleted []string
	for _, op := range operations(h.nft.last()) {
		switch {
		case !strings.Contains(op, service):
			t.Errorf("unexpected %q", op)
		case strings.HasPrefix(op, "delete chain ip kube-proxy "):
			deleted = append(deleted, op)
		case !strings.HasPrefix(op, "add chain ip kube-proxy "):
			t.Errorf("unexpected %q", op)
		}
	}
	if len(deleted) != n {
		t.Errorf("want the %d chains of %s deleted, got:\n%s", n, service, h.nft.last())
	}
	for name := range h.nft.Table.Chains {
		if strings.Contains(name, service) {
			t.Errorf("chain %s still there", name)
		}
	}
}

// Stale chains are deleted in a transaction of their own: when it fails
// the sync still succeeds, the failure is counted, and a later sync
// deletes them; the sync's own changes are in place meanwhile.
func TestFailedStaleChainDeletionIsRetried(t *testing.T) {
	h, now := removeFidA(t)
	failures := cleanupFailures(t)

	*now = now.Add(2 * time.Second)
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.15")))
	n := len(h.nft.txs)
	h.nft.failRun = 2 // the sync's own transaction passes, the deletion fails
	h.partial()
	if len(h.nft.txs) != n+1 || !strings.Contains(h.nft.last(), "10.244.1.15") {
		t.Fatalf("the sync's transaction was not applied alone:\n%s", strings.Join(h.nft.txs[n:], "\n"))
	}
	if got := cleanupFailures(t); got != failures+1 {
		t.Errorf("cleanup failures %v, want %v", got, failures+1)
	}
	if h.nft.Table.Chains["service-DMA2WJPR-hx-conf/fid-a/tcp/http"] == nil {
		t.Fatal("a chain is gone though its deletion failed")
	}
	if due := h.syncer.NextSync(); !due.IsZero() {
		t.Errorf("a failed deletion asks for a sync at %v; it should wait for the next one", due)
	}

	h.changed = nil
	h.partial()
	requireStaleChainsDeleted(t, h, "fid-a", 8)
	checkAgainstFreshSync(t, h)
}

// After a failed transaction nothing is assumed: the partial sync fails,
// the full sync that follows reads the table again and fixes it all.
func TestFailedTransactionThenFullSync(t *testing.T) {
	h := sampleHarness(t)
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.15")))
	h.nft.failNext = true
	if err := h.syncer.PartialSync(h.view(), h.changed); err == nil {
		t.Fatal("the failed transaction was not reported")
	}
	if err := h.syncer.PartialSync(h.view(), nil); err == nil {
		t.Fatal("a partial sync after a failure did not ask for a full one")
	}
	h.full()
	checkAgainstFreshSync(t, h)
	if tx := h.nft.last(); !strings.Contains(tx, "10.244.1.15") || strings.Contains(tx, "fid-a") {
		t.Errorf("the full sync should write fid-b's change only:\n%s", tx)
	}
}

// A full sync removes what the state no longer has: another run's
// service chains and sets, and elements no one wants. As upstream's, it
// leaves another program's chain in the table (a name without "/").
func TestFullSyncRemovesStaleObjects(t *testing.T) {
	h := sampleHarness(t)
	tx := h.nft.NewTransaction()
	tx.Add(&knftables.Chain{Name: "service-AAAAAAAA-gone/svc/tcp/p"})
	tx.Add(&knftables.Rule{Chain: "service-AAAAAAAA-gone/svc/tcp/p", Rule: "meta l4proto tcp dnat ip to numgen random mod 1 map { 0 : 10.244.9.9 . 80 }"})
	tx.Add(&knftables.Chain{Name: "someone-elses"})
	tx.Add(&knftables.Rule{Chain: "someone-elses", Rule: "counter"})
	tx.Add(&knftables.Set{Name: "affinity-AAAAAAAA-gone/svc/tcp/p__10.244.9.9/80", Type: "ipv4_addr", Flags: []knftables.SetFlag{"dynamic", "timeout"}, Timeout: ptr(time.Hour)})
	tx.Add(&knftables.Element{Map: mapServiceIPs, Key: []string{"10.96.99.99", "tcp", "80"}, Value: []string{"goto service-AAAAAAAA-gone/svc/tcp/p"}})
	tx.Add(&knftables.Element{Set: setClusterIPs, Key: []string{"10.96.99.99"}})
	if err := h.nft.Fake.Run(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	h.syncer = h.newSyncer(v1.IPv4Protocol, h.syncer.cfg.Params)
	h.full()
	want := []string{
		"flush chain ip kube-proxy service-AAAAAAAA-gone/svc/tcp/p",
		"delete set ip kube-proxy affinity-AAAAAAAA-gone/svc/tcp/p__10.244.9.9/80",
		"delete element ip kube-proxy cluster-ips { 10.96.99.99 }",
		"delete element ip kube-proxy service-ips { 10.96.99.99 . tcp . 80 }",
	}
	requireTransaction(t, h, want)
	h.syncer.now = func() time.Time { return time.Now().Add(time.Minute) }
	h.changed = nil
	h.partial()
	if rules, err := h.nft.ListRules(t.Context(), "someone-elses"); err != nil || len(rules) != 1 {
		t.Errorf("another program's chain: %v, %v; want it left with its rule", rules, err)
	}
	tx = h.nft.NewTransaction()
	tx.Delete(&knftables.Chain{Name: "someone-elses"})
	if err := h.nft.Fake.Run(t.Context(), tx); err != nil {
		t.Fatal(err)
	}
	checkAgainstFreshSync(t, h)
}

// New ServiceCIDRs rewrite cluster-ips-check in the next sync, alone.
func TestServiceCIDRChangeRewritesClusterIPsCheck(t *testing.T) {
	h := sampleHarness(t)
	h.syncer.SetServiceCIDRs([]netip.Prefix{netip.MustParsePrefix("10.96.0.0/16"), netip.MustParsePrefix("10.97.0.0/16")})
	h.changed = nil
	h.partial()
	want := []string{
		"flush chain ip kube-proxy cluster-ips-check",
		`add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"`,
		`add rule ip kube-proxy cluster-ips-check ip daddr { 10.96.0.0/15 } drop comment "Drop traffic to unallocated ClusterIPs"`,
	}
	requireTransaction(t, h, want)
}

// The watch lists nothing while the generation is the one our own
// transactions left; another program's change is listed once; a flushed
// or deleted table is noticed until a full sync repairs it; a change that
// slipped in just before one of our transactions is not taken for ours.
func TestWatchListsOnlyAfterOtherChanges(t *testing.T) {
	h := sampleHarness(t)
	check := func(wantGone bool, wantLists int) {
		t.Helper()
		lists := h.nft.lists
		got, changed := h.syncer.check(t.Context())
		if (got != "") != wantGone {
			t.Errorf("check found %q, want something missing: %v", got, wantGone)
		}
		if listed := h.nft.lists > lists; changed != listed {
			t.Errorf("check says another program changed the ruleset: %v, but it listed the table: %v", changed, listed)
		}
		if h.nft.lists != wantLists {
			t.Errorf("%d listings, want %d", h.nft.lists, wantLists)
		}
	}
	foreign := func(tx *knftables.Transaction) {
		t.Helper()
		if err := h.nft.Fake.Run(t.Context(), tx); err != nil {
			t.Fatal(err)
		}
		h.nft.gen++
	}
	check(false, 0)
	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.15")))
	h.partial()
	check(false, 0)

	tx := h.nft.NewTransaction()
	tx.Add(&knftables.Chain{Name: "someone-elses"})
	foreign(tx)
	check(false, 1)
	check(false, 1)

	h.apply(endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.16")))
	h.nft.interleave = true
	h.partial()
	check(false, 2)

	tx = h.nft.NewTransaction()
	tx.Flush(&knftables.Chain{Name: chainNATPrerouting})
	foreign(tx)
	check(true, 3)
	check(true, 4)
	h.full()
	check(false, 4)

	if err := Cleanup(t.Context(), h.nft.Fake); err != nil {
		t.Fatal(err)
	}
	h.nft.gen++
	check(true, 5)
	h.full()
	check(false, 5)
	checkAgainstFreshSync(t, h)
}

func TestAddressSet(t *testing.T) {
	p := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, netip.MustParsePrefix(x))
		}
		return out
	}
	for _, c := range []struct {
		in   []netip.Prefix
		want string
	}{
		{p("10.96.0.0/16"), "10.96.0.0/16"},
		{p("203.0.113.10/32"), "203.0.113.10"},
		{p("10.0.0.2/32", "10.0.0.1/32"), "{ 10.0.0.1, 10.0.0.2 }"},
		{p("10.0.0.0/8", "10.1.0.0/16"), "{ 10.0.0.0/8 }"},
		{p("10.0.0.0/31", "10.0.0.2/31"), "{ 10.0.0.0/30 }"},
		{p("10.0.2.0/24", "10.0.0.0/24", "10.0.1.0/24"), "{ 10.0.0.0-10.0.2.255 }"},
		{p("0.0.0.0/1", "128.0.0.0/1"), "{ 0.0.0.0/0 }"},
		{p("203.0.113.0/24", "10.0.0.1/32", "1.2.3.4/32", "9.0.0.0/8"), "{ 1.2.3.4, 9.0.0.0/8, 10.0.0.1, 203.0.113.0/24 }"},
		{p("::1/128", "::2/128", "fd00::/64", "fd00:0:0:1::/64"), "{ ::1-::2, fd00::/63 }"},
	} {
		if got := addressSet(c.in); got != c.want {
			t.Errorf("addressSet(%v) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A sync larger than maxTxOps is written in transactions of at most that
// many operations but one (what changes objects already there, at once),
// and after each every chain a packet can reach (from a base chain,
// through jumps, gotos and verdict maps) exists and holds its rules from
// before the sync or its final ones: no element or rule points at a
// missing or half-written chain. Also for a partial sync of many changes.
func TestLargeSyncIsSplitKeepingEveryStateValid(t *testing.T) {
	h := newHarness(t, v1.IPv4Protocol, v4(nil)(t))
	h.syncer.maxTxOps = 5
	before, final := newTable(), (*table)(nil)
	steps := 0
	h.nft.afterRun = func() {
		steps++
		requireReachableChainsComplete(t, h, before, final, steps)
	}
	h.apply(sampleObjects()...)
	final = freshTable(t, h)
	h.full()
	if steps < 10 {
		t.Errorf("the first sync was written in %d transactions", steps)
	}
	checkAgainstFreshSync(t, h)

	var objs []any
	for i := range 5 {
		name := fmt.Sprintf("new-%d", i)
		objs = append(objs, service("ns", name, fmt.Sprintf("10.96.20.%d", i+1), http80, nil),
			endpointSlice("ns", name, ep8080, ep(fmt.Sprintf("10.244.2.%d", i+1))))
	}
	objs = append(objs, endpointSlice("hx-conf", "fid-b", ep8080, ep("10.244.1.15")))
	h.apply(objs...)
	n := len(h.nft.txs)
	before, final, steps = final, freshTable(t, h), 0
	h.partial()
	if steps < 3 {
		t.Errorf("the partial sync was written in %d transactions", steps)
	}
	requireBoundedButOne(t, h.nft.txs[:n], 5)
	requireBoundedButOne(t, h.nft.txs[n:], 5)
	checkAgainstFreshSync(t, h)
}

func requireBoundedButOne(t *testing.T, txs []string, most int) {
	t.Helper()
	larger := 0
	for _, tx := range txs {
		if len(operations(tx)) > most {
			larger++
		}
	}
	if larger > 1 {
		t.Errorf("%d transactions of more than %d operations:\n%s", larger, most, strings.Join(txs, "\n"))
	}
}

// freshTable is the table one full sync of h's state writes.
func freshTable(t *testing.T, h *harness) *table {
	t.Helper()
	fresh := newHarness(t, v1.IPv4Protocol, h.syncer.cfg.Params)
	fresh.state, fresh.node = h.state, h.node
	fresh.full()
	tb, err := readTable(t.Context(), listFake(fresh.nft.Fake), "table", "")
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

var chainRef = regexp.MustCompile(`(?:jump|goto) ([^\s,}]+)|@([^\s,}]+)`)

// requireReachableChainsComplete checks that every chain reachable from a
// base chain of h's table holds the rules it has in before or in final.
func requireReachableChainsComplete(t *testing.T, h *harness, before, final *table, step int) {
	t.Helper()
	tb, err := readTable(t.Context(), listFake(h.nft.Fake), "table", "")
	if err != nil {
		t.Fatal(err)
	}
	var todo []string
	for name, c := range tb.chains {
		if c.Hook != nil {
			todo = append(todo, name)
		}
	}
	seen := map[string]bool{}
	follow := func(text string) {
		for _, m := range chainRef.FindAllStringSubmatch(text, -1) {
			if m[1] != "" {
				todo = append(todo, m[1])
			} else if ts := tb.sets[m[2]]; ts != nil && ts.Map {
				for _, v := range ts.elements {
					todo = append(todo, chainRef.FindAllString(v, -1)...)
				}
			}
		}
	}
	for len(todo) > 0 {
		name := strings.TrimPrefix(strings.TrimPrefix(todo[0], "goto "), "jump ")
		todo = todo[1:]
		if seen[name] {
			continue
		}
		seen[name] = true
		c, ok := tb.chains[name]
		switch {
		case !ok:
			t.Errorf("after transaction %d: chain %s is reachable but missing", step, name)
			continue
		case !sameRulesAs(c, final.chains[name]) && !sameRulesAs(c, before.chains[name]):
			t.Errorf("after transaction %d: chain %s is reachable but not complete: %q", step, name, c.Rules)
		}
		for _, r := range c.Rules {
			follow(r)
		}
	}
}

func sameRulesAs(c, other *tableChain) bool { return other != nil && sameRules(c.Rules, other.Rules) }

// Up to cascadeLimit endpoints, connections are spread by a cascade of
// rules, with upstream's map rule as the equivalent; above it by the map
// rule alone.
func TestSpread(t *testing.T) {
	targets := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = "goto e" + strconv.Itoa(i)
		}
		return out
	}
	rules, upstream := spread("p ", targets(3), "numgen random mod %d vmap { %s }", targets(3))
	want := []string{"p numgen random mod 3 0 goto e0", "p numgen random mod 2 0 goto e1", "p goto e2"}
	if !slices.Equal(rules, want) || !slices.Equal(upstream, []string{"numgen random mod 3 vmap { 0 : goto e0, 1 : goto e1, 2 : goto e2 }"}) {
		t.Errorf("3 targets: rules %q, upstream %q", rules, upstream)
	}
	rules, upstream = spread("p ", targets(cascadeLimit+1), "numgen random mod %d vmap { %s }", targets(cascadeLimit+1))
	if len(rules) != 1 || !strings.HasPrefix(rules[0], "numgen random mod 33 vmap { 0 : goto e0, ") || upstream != nil {
		t.Errorf("%d targets: rules %q, upstream %q", cascadeLimit+1, rules, upstream)
	}
}
