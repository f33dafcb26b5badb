package nftables

import (
	"context"
	"errors"
	"flag"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/localdetect"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

var update = flag.Bool("update", false, "rewrite the golden files of pkg/nftables/testdata")

const nodeName = "node-1"

// dump is the Fake's table as knftables dumps it, elements sorted (their
// order is the order they were added in) and verdict maps written as nft
// prints them.
func dump(f *knftables.Fake) string {
	var lines, elements []string
	for _, l := range strings.Split(strings.TrimSuffix(f.Dump(), "\n"), "\n") {
		l = strings.ReplaceAll(l, " , ", ", ")
		if strings.HasPrefix(l, "add element ") {
			elements = append(elements, l)
		} else {
			lines = append(lines, l)
		}
	}
	slices.Sort(elements)
	return strings.Join(append(lines, elements...), "\n") + "\n"
}

// replay writes a parsed table into an empty Fake, as a transaction of
// what it holds.
func replay(t *testing.T, tb *table, family knftables.Family) *knftables.Fake {
	t.Helper()
	f := knftables.NewFake(family, TableName)
	tx := f.NewTransaction()
	tx.Add(&knftables.Table{Comment: &tb.comment})
	for _, name := range sortedKeys(tb.counters) {
		tx.Add(&knftables.Counter{Name: name})
	}
	for _, name := range sortedKeys(tb.sets) {
		tx.Add(tb.sets[name].object())
	}
	for _, name := range sortedKeys(tb.chains) {
		c := *tb.chains[name].Chain
		tx.Add(&c)
	}
	for _, name := range sortedKeys(tb.chains) {
		for _, r := range tb.chains[name].Rules {
			tx.Add(&knftables.Rule{Chain: name, Rule: writable(r)})
		}
	}
	for _, name := range sortedKeys(tb.sets) {
		ts := tb.sets[name]
		for _, key := range sortedKeys(ts.elements) {
			e := ts.element(key).(*knftables.Element)
			if ts.Map {
				e.Value = []string{ts.elements[key]}
			}
			if c, ok := ts.comments[key]; ok {
				e.Comment = &c
			}
			tx.Add(e)
		}
	}
	if err := f.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return f
}

// recorder is a Fake that keeps each transaction it ran, and can fail one
// of the next: failNext the next, failRun the nth (1 the next). gen is the
// ruleset generation, moved by each transaction (and by tests, for other
// programs' changes; interleave has one come just before the next
// transaction); lists counts the chain listings.
type recorder struct {
	*knftables.Fake
	txs        []string
	failNext   bool
	failRun    int
	gen        uint64
	interleave bool
	lists      int
	// afterRun, if set, looks at the table after each transaction.
	afterRun func()
}

func (r *recorder) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	r.lists++
	return r.Fake.ListRules(ctx, chain)
}

func (r *recorder) Run(ctx context.Context, tx *knftables.Transaction) error {
	if r.failNext {
		r.failRun, r.failNext = 1, false
	}
	if r.failRun > 0 {
		if r.failRun--; r.failRun == 0 {
			return errors.New("nft: Error: Could not process rule: No such file or directory")
		}
	}
	if r.interleave {
		r.interleave = false
		r.gen++
	}
	if err := r.Fake.Run(ctx, tx); err != nil {
		return err
	}
	r.gen++
	r.txs = append(r.txs, tx.String())
	if r.afterRun != nil {
		r.afterRun()
	}
	return nil
}

// last is the last transaction ("" if the last sync sent none since
// reset).
func (r *recorder) last() string {
	if len(r.txs) == 0 {
		return ""
	}
	return r.txs[len(r.txs)-1]
}

// harness is one family's syncer on a Fake, fed with API objects through
// the project's change tracker.
type harness struct {
	t       *testing.T
	nft     *recorder
	syncer  *Syncer
	tracker *state.Tracker
	state   *state.State
	node    state.Node
	changed map[state.ServicePortName]bool
}

func newHarness(t *testing.T, family v1.IPFamily, params Params) *harness {
	t.Helper()
	kf := knftables.IPv4Family
	if family == v1.IPv6Protocol {
		kf = knftables.IPv6Family
	}
	h := &harness{t: t, nft: &recorder{Fake: knftables.NewFake(kf, TableName)},
		tracker: state.NewTracker(family, nodeName), state: state.NewState(), node: state.Node{Name: nodeName}}
	h.syncer = h.newSyncer(family, params)
	return h
}

// newSyncer is another syncer on the same table: a restart.
func (h *harness) newSyncer(family v1.IPFamily, params Params) *Syncer {
	// The recorder's table, its transactions and its generation, which
	// tests move for other programs' changes too.
	k := NewFake(family)
	k.Fake, k.nft, k.generation = h.nft.Fake, h.nft, func() uint64 { return h.nft.gen }
	s, err := New(Config{Family: family, Kernel: k, Params: params})
	if err != nil {
		h.t.Fatal(err)
	}
	return s
}

func (h *harness) apply(objs ...any) {
	for _, o := range objs {
		switch o := o.(type) {
		case *v1.Service:
			h.tracker.OnService(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, o)
		case *discovery.EndpointSlice:
			h.tracker.OnEndpointSlice(o, false)
		default:
			h.t.Fatalf("cannot apply %T", o)
		}
	}
	h.changed = h.tracker.Apply(h.state).ServicePorts
}

func (h *harness) view() state.View { return state.View{State: h.state, Node: h.node} }

func (h *harness) full() {
	h.t.Helper()
	if err := h.syncer.FullSync(h.view()); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) partial() {
	h.t.Helper()
	if err := h.syncer.PartialSync(h.view(), h.changed); err != nil {
		h.t.Fatal(err)
	}
}

// API objects.

type port struct {
	name     string
	protocol v1.Protocol
	port     int32
	nodePort int32
}

func service(ns, name, clusterIP string, ports []port, mutate func(*v1.Service)) *v1.Service {
	s := &v1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: clusterIP, ClusterIPs: []string{clusterIP}},
	}
	for _, p := range ports {
		s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{Name: p.name, Protocol: p.protocol, Port: p.port, NodePort: p.nodePort})
	}
	if mutate != nil {
		mutate(s)
	}
	return s
}

// ep is one endpoint: "ip" ready on this node, with options "node=x"
// (another node, "" for none), "terminating", "zone=z".
func ep(ip string, opts ...string) discovery.Endpoint {
	node, ready, terminating := nodeName, true, false
	e := discovery.Endpoint{Addresses: []string{ip}}
	for _, o := range opts {
		switch k, v, _ := strings.Cut(o, "="); k {
		case "node":
			node = v
		case "terminating":
			ready, terminating = false, true
		case "hint":
			e.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: v}}}
		case "zone":
			e.Zone = &v
		}
	}
	if node != "" {
		e.NodeName = &node
	}
	e.Conditions = discovery.EndpointConditions{Ready: &ready, Serving: ptr(true), Terminating: &terminating}
	return e
}

func endpointSlice(ns, svc string, ports []port, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	s := &discovery.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: ns, Name: svc + "-" + strconv.Itoa(len(eps)), Labels: map[string]string{discovery.LabelServiceName: svc}},
		AddressType: discovery.AddressTypeIPv4,
		Endpoints:   eps,
	}
	s.Name = svc + "-1"
	for _, p := range ports {
		s.Ports = append(s.Ports, discovery.EndpointPort{Name: ptr(p.name), Port: ptr(p.port), Protocol: ptr(p.protocol)})
	}
	if len(eps) > 0 && netip.MustParseAddr(eps[0].Addresses[0]).Is6() {
		s.AddressType = discovery.AddressTypeIPv6
	}
	return s
}

func ptr[T any](v T) *T { return &v }

func detector(t *testing.T, mode string, family v1.IPFamily, cidr string) localdetect.Detector {
	t.Helper()
	d, err := localdetect.New(localdetect.Settings{Mode: mode, CIDRs: []string{cidr}, BridgeInterface: "cbr0", InterfaceNamePrefix: "veth"}, family)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
