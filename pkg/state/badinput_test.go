package state

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2/ktesting"

	"github.com/rapidproxy/rapidproxy/internal/badinput"
)

var families = []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol}

// loggedTracker is a tracker whose log lines are kept in log.
func loggedTracker(family v1.IPFamily) (*Tracker, *ktesting.BufferTL) {
	log := &ktesting.BufferTL{}
	tr := NewTracker(family, "node-1")
	tr.logger = ktesting.NewLogger(log, ktesting.NewConfig(ktesting.Verbosity(2)))
	return tr, log
}

// goodState is the state of the good objects alone.
func goodState(family v1.IPFamily) *State {
	tr := NewTracker(family, "node-1")
	st := NewState()
	badinput.Good().AddTo(tr)
	tr.Apply(st)
	return st
}

// wellFormed lists what in the state could not be programmed: everything
// in it must be valid, whatever went in.
func wellFormed(family v1.IPFamily, st *State) []string {
	var bad []string
	ofFamily := func(what string, ok bool) {
		if !ok {
			bad = append(bad, what)
		}
	}
	portNumber := func(p int32, zeroOK bool) bool { return (zeroOK && p == 0) || (p >= 1 && p <= 65535) }
	for spn, sp := range st.Services {
		what := fmt.Sprintf("service port %q", spn)
		ofFamily(what+": key differs from name", spn == sp.Name)
		ofFamily(what+": namespace", len(validation.IsDNS1123Label(spn.Namespace)) == 0)
		ofFamily(what+": name", len(validation.IsDNS1123Label(spn.Name)) == 0)
		ofFamily(what+": port name", spn.Port == "" || len(validation.IsDNS1123Label(spn.Port)) == 0)
		ofFamily(what+": protocol", supportedProtocol(sp.Protocol) && sp.Protocol == spn.Protocol)
		ofFamily(what+": port", portNumber(sp.Port, false))
		ofFamily(what+": node port", portNumber(sp.NodePort, true))
		ofFamily(what+": health check node port", portNumber(sp.HealthCheckNodePort, true))
		ofFamily(what+": affinity timeout", sp.AffinityTimeoutSeconds >= 0 && sp.AffinityTimeoutSeconds <= maxAffinityTimeout)
		ofFamily(what+": cluster IP", sp.ClusterIP.IsValid() && familyOf(sp.ClusterIP) == family)
		for _, a := range append(slices.Clone(sp.ExternalIPs), sp.LoadBalancerIPs...) {
			ofFamily(what+": address "+a.String(), a.IsValid() && familyOf(a) == family)
		}
		for _, r := range sp.LoadBalancerSourceRanges {
			ofFamily(what+": source range "+r.String(), r.IsValid() && familyOf(r.Addr()) == family)
		}
	}
	for spn, eps := range st.Endpoints {
		for i, ep := range eps {
			what := fmt.Sprintf("endpoint %s of %q", ep, spn)
			ofFamily(what+": address", ep.IP.IsValid() && familyOf(ep.IP) == family)
			ofFamily(what+": port", portNumber(ep.Port, false))
			ofFamily(what+": order", i == 0 || eps[i-1].String() < ep.String())
		}
	}
	return bad
}

// sameGoodServices lists the good service ports whose definition or
// endpoints differ between st and the good objects' own state.
func sameGoodServices(st, good *State) []string {
	var differ []string
	for spn, sp := range good.Services {
		if !reflect.DeepEqual(st.Services[spn], sp) || !reflect.DeepEqual(st.Endpoints[spn], good.Endpoints[spn]) {
			differ = append(differ, spn.String())
		}
	}
	return differ
}

// checkBadInput puts objs next to the good objects through a tracker of
// each family: what comes out is well-formed, the good services are as
// they are alone, and removing objs leaves exactly the good state. It
// returns each family's log.
func checkBadInput(t *testing.T, objs badinput.Objects) (logs string) {
	t.Helper()
	for _, family := range families {
		tr, log := loggedTracker(family)
		st := NewState()
		badinput.Good().AddTo(tr)
		objs.AddTo(tr)
		tr.Apply(st)
		if bad := wellFormed(family, st); len(bad) > 0 {
			t.Errorf("%s: the state holds what cannot be programmed:\n%s", family, strings.Join(bad, "\n"))
		}
		if objs.UsesGoodNames() {
			continue
		}
		good := goodState(family)
		if differ := sameGoodServices(st, good); len(differ) > 0 {
			t.Errorf("%s: good services changed next to bad objects: %v", family, differ)
		}
		objs.RemoveFrom(tr)
		tr.Apply(st)
		if !reflect.DeepEqual(st.Services, good.Services) || !reflect.DeepEqual(st.Endpoints, good.Endpoints) {
			t.Errorf("%s: removing the bad objects does not leave the good state", family)
		}
		logs += log.String()
	}
	return logs
}

// FuzzEndpointSlices feeds arbitrary Services and EndpointSlices (JSON,
// see internal/badinput) to the tracker next to good ones. Seeds:
// testdata/fuzz/FuzzEndpointSlices, one per kind of bad input.
func FuzzEndpointSlices(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if objs, ok := badinput.Decode(data); ok {
			checkBadInput(t, objs)
		}
	})
}

func TestBadObjectsAreSkippedWithALoggedReason(t *testing.T) {
	for _, tc := range badinput.Cases() {
		t.Run(tc.Name, func(t *testing.T) {
			logs := checkBadInput(t, tc.Objects)
			if tc.Skipped == "" {
				if strings.Contains(logs, "Skipping") {
					t.Errorf("valid objects, yet something was skipped:\n%s", logs)
				}
				return
			}
			// klog names the object "namespace/name", indenting the
			// lines of a multi-line value.
			named := strings.Contains(logs, strings.ReplaceAll(tc.Skipped, "\n", "\n\t"))
			if !strings.Contains(logs, "Skipping") || !named {
				t.Errorf("no logged reason naming %q:\n%s", tc.Skipped, logs)
			}
		})
	}
}

func TestSkipsAreLoggedOncePerChange(t *testing.T) {
	tr, log := loggedTracker(v1.IPv4Protocol)
	st := NewState()
	var bad badinput.Case
	for _, tc := range badinput.Cases() {
		if tc.Name == "ipv6-endpoints-in-an-ipv4-slice" {
			bad = tc
		}
	}
	bad.AddTo(tr)
	tr.Apply(st)
	if n := strings.Count(log.String(), "Skipping"); n != 1 {
		t.Fatalf("want one logged skip, got %d:\n%s", n, log.String())
	}
	// Another slice of the service changes, and syncs come and go: the
	// bad slice is not logged again.
	other := bad.EndpointSlices[0].DeepCopy()
	other.Name, other.Endpoints = "v6-in-v4-2", other.Endpoints[1:]
	tr.OnEndpointSlice(other, false)
	tr.Apply(st)
	tr.Apply(st)
	if n := strings.Count(log.String(), "Skipping"); n != 1 {
		t.Errorf("logged again without a change of the bad slice:\n%s", log.String())
	}
	tr.OnEndpointSlice(bad.EndpointSlices[0], false)
	tr.Apply(st)
	if n := strings.Count(log.String(), "Skipping"); n != 2 {
		t.Errorf("a change of the bad slice should log once more:\n%s", log.String())
	}
}

func TestARelabelledSliceLeavesItsOldService(t *testing.T) {
	tr := NewTracker(v1.IPv4Protocol, "node-1")
	st := NewState()
	tr.OnEndpointSlice(slice("a", "s-1", "IPv4", 80, v1.ProtocolTCP, endpoint("10.0.0.1", true, "n")), false)
	tr.Apply(st)
	tr.OnEndpointSlice(slice("b", "s-1", "IPv4", 80, v1.ProtocolTCP, endpoint("10.0.0.1", true, "n")), false)
	if got := changed(tr.Apply(st)); got != "ns/a:http/TCP ns/b:http/TCP" {
		t.Errorf("changed %q", got)
	}
	if len(st.Endpoints[spn("a", "http", v1.ProtocolTCP)]) != 0 || len(st.Endpoints[spn("b", "http", v1.ProtocolTCP)]) != 1 {
		t.Errorf("endpoints after relabelling: %v", st.Endpoints)
	}
	// Losing its label, it belongs to no service.
	unowned := slice("b", "s-1", "IPv4", 80, v1.ProtocolTCP)
	unowned.Labels = nil
	tr.OnEndpointSlice(unowned, false)
	tr.Apply(st)
	if len(st.Endpoints) != 0 {
		t.Errorf("endpoints of an unlabelled slice: %v", st.Endpoints)
	}
}

// A Service port's name is a DNS label to the API server (upstream's e2e
// "named targetPorts" test names one "mutable-named-port", 18 characters);
// only container port names are IANA service names of up to 15.
func TestServicePortNameIsADNSLabel(t *testing.T) {
	for name, ok := range map[string]bool{"mutable-named-port": true, strings.Repeat("a", 63): true,
		strings.Repeat("a", 64): false, "Upper": false, "under_score": false} {
		if got := servicePortProblem(&v1.ServicePort{Name: name, Port: 80, Protocol: v1.ProtocolTCP}) == ""; got != ok {
			t.Errorf("port name %q: programmed %v, want %v", name, got, ok)
		}
	}
}
