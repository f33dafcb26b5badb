package ipvs

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// canonicalEntry checks an entry of a set of the given type and family the
// way ipset and the kernel do, and returns it as `ipset save` prints it:
// addresses in their canonical form, protocol names in lower case, a net's
// host bits cleared and a full-length prefix dropped.
//
// It accepts only what kube-proxy writes, so it is stricter than ipset:
// no ranges or CIDRs where ipset would add many entries, no protocols but
// TCP, UDP and SCTP, no service names or protocol prefixes for ports, and
// no inet_aton forms ("010.0.0.1", "1.2.3"), which ipset reads as other
// addresses.
func canonicalEntry(t SetType, ipv6 bool, entry string) (string, error) {
	parts := strings.Split(entry, ",")
	want := map[SetType]int{
		HashIP: 1, HashIPPort: 2, HashIPPortIP: 3, HashIPPortNet: 3, BitmapPort: 1,
	}[t]
	if want == 0 {
		return "", fmt.Errorf("unknown set type %q", t)
	}
	if len(parts) != want {
		return "", fmt.Errorf("syntax error: %s takes %d comma-separated elements", t, want)
	}
	if t == BitmapPort {
		_, err := parsePort(parts[0])
		return parts[0], err
	}
	ip, err := parseIP(parts[0], ipv6)
	if err != nil {
		return "", err
	}
	out := []string{ip.String()}
	// hash:ip holds no all-zero address, nor does hash:ip,port on recent
	// kernels (6.18 refuses it, 6.1 takes it); the types with a third
	// element do.
	if ip.IsUnspecified() && want < 3 {
		return "", errors.New("null-valued element, cannot be stored in a hash type of set")
	}
	if want >= 2 {
		proto, port, found := strings.Cut(parts[1], ":")
		if !found {
			proto, port = "tcp", parts[1] // ipset's default protocol
		}
		switch proto {
		case "tcp", "udp", "sctp", "TCP", "UDP", "SCTP": // /etc/protocols' names and aliases
		default:
			return "", fmt.Errorf("syntax error: protocol %q (the fake knows tcp, udp and sctp)", proto)
		}
		if _, err := parsePort(port); err != nil {
			return "", err
		}
		out = append(out, strings.ToLower(proto)+":"+port)
	}
	switch t {
	case HashIPPortIP:
		ip2, err := parseIP(parts[2], ipv6)
		if err != nil {
			return "", err
		}
		out = append(out, ip2.String())
	case HashIPPortNet:
		net, err := parseNet(parts[2], ipv6)
		if err != nil {
			return "", err
		}
		out = append(out, net)
	}
	return strings.Join(out, ","), nil
}

func parseIP(s string, ipv6 bool) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("syntax error: cannot parse %q as an address", s)
	}
	if ip.Is6() != ipv6 {
		return netip.Addr{}, fmt.Errorf("syntax error: %s is not of the set's family", s)
	}
	return ip, nil
}

// parseNet reads an address with an optional prefix length (1 to the
// address length; none means a host).
func parseNet(s string, ipv6 bool) (string, error) {
	addr, bits, hasBits := strings.Cut(s, "/")
	ip, err := parseIP(addr, ipv6)
	if err != nil {
		return "", err
	}
	if !hasBits {
		return ip.String(), nil
	}
	n, err := strconv.Atoi(bits)
	if err != nil || n < 1 || n > ip.BitLen() || bits != strconv.Itoa(n) {
		return "", fmt.Errorf("the value of the CIDR parameter of %s is invalid", s)
	}
	if n == ip.BitLen() {
		return ip.String(), nil
	}
	return netip.PrefixFrom(ip, n).Masked().String(), nil
}

// parsePort reads a port as ipset does: decimal, no leading zeros.
func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || s != strconv.FormatUint(n, 10) {
		return 0, fmt.Errorf("syntax error: cannot parse %q as a port", s)
	}
	return uint16(n), nil
}
