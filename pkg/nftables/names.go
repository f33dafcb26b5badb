package nftables

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"

	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// Prefixes of the per-service objects, as upstream names them.
const (
	prefixService  = "service-"
	prefixLocal    = "local-"
	prefixExternal = "external-"
	prefixFirewall = "firewall-"
	prefixEndpoint = "endpoint-"
	prefixAffinity = "affinity-"
)

// nameBaseMax is the longest hashed base: upstream keeps room for a 16
// character prefix within nft's name limit.
const nameBaseMax = knftables.NameLengthMax - 16

// hashed is "HASH-base", HASH being the first 8 characters of
// base32(sha256(base)), cut to nameBaseMax with "..." as upstream does (the
// hash keeps a cut name unique).
func hashed(base string) string {
	sum := sha256.Sum256([]byte(base))
	name := base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" + base
	if len(name) > nameBaseMax {
		name = name[:nameBaseMax-3] + "..."
	}
	return name
}

// serviceBase is "ns/name/proto/port"; "/" cannot occur in any of its
// parts, so a name with one is a per-service object.
func serviceBase(name state.ServicePortName) string {
	return name.Namespace + "/" + name.Name + "/" + strings.ToLower(string(name.Protocol)) + "/" + name.Port
}

// serviceNames are one service port's chain names, and the verdicts
// going to them. Each name is the tail of its verdict ("goto " + name):
// the syncer keeps both, the chain's name and a map element's value, for
// as long as the service port stays, in one string.
type serviceNames struct {
	cluster, local, external, firewall                 string
	gotoCluster, gotoLocal, gotoExternal, gotoFirewall string
}

const gotoVerdict = "goto "

func namesFor(name state.ServicePortName) serviceNames {
	h := hashed(serviceBase(name))
	n := serviceNames{
		gotoCluster:  gotoVerdict + prefixService + h,
		gotoLocal:    gotoVerdict + prefixLocal + h,
		gotoExternal: gotoVerdict + prefixExternal + h,
		gotoFirewall: gotoVerdict + prefixFirewall + h,
	}
	n.cluster, n.local = n.gotoCluster[len(gotoVerdict):], n.gotoLocal[len(gotoVerdict):]
	n.external, n.firewall = n.gotoExternal[len(gotoVerdict):], n.gotoFirewall[len(gotoVerdict):]
	return n
}

// gotoPolicyChain is the verdict going to the chain traffic on the path
// goes to.
func (n serviceNames) gotoPolicyChain(p state.Path) string {
	if p.Local {
		return n.gotoLocal
	}
	return n.gotoCluster
}

// endpointBase is the hashed "ns/name/proto/port__ip/port", IPv6 colons
// written as dots (a chain name may not hold a colon).
func endpointBase(name state.ServicePortName, ep *state.Endpoint) string {
	ip := strings.ReplaceAll(ep.IP.String(), ":", ".")
	return hashed(serviceBase(name) + "__" + ip + "/" + itoa(ep.Port))
}

// isServiceObject tells a per-service chain or set from the fixed ones.
func isServiceObject(name string) bool { return strings.Contains(name, "/") }
