package ipvs

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ipsets is the ipset part of Kernel, in the network namespace of the
// calling thread: one ipset process per change or creation; the reads
// (SetSizes, SetEntries, EnsureSets with nothing to create) over netlink.
type ipsets struct{}

// createArgs are the arguments upstream's createSet passes to
// `ipset create`, -exist included.
func createArgs(s SetSpec) (string, error) {
	switch s.Type {
	case HashIP, HashIPPort, HashIPPortIP, HashIPPortNet:
		family := "inet"
		if s.IPv6 {
			family = "inet6"
		}
		return fmt.Sprintf("%s %s family %s hashsize 1024 maxelem %d -exist", s.Name, s.Type, family, s.Limit()), nil
	case BitmapPort:
		return fmt.Sprintf("%s %s range 0-65535 -exist", s.Name, s.Type), nil
	}
	return "", fmt.Errorf("ipset %s: unknown type %q", s.Name, s.Type)
}

// EnsureSets creates the missing sets in one `ipset restore`. A set that
// exists with another type, family or size makes it fail. When every set
// exists as it would be created (their headers say so: the restart over
// sets in place), it starts no process, once ipset is found installed (the
// syncs need it).
func (ipsets) EnsureSets(sets []SetSpec) error {
	if _, err := exec.LookPath("ipset"); err == nil {
		if headers, err := setHeaders(); err == nil && allExist(headers, sets) {
			return nil
		}
	}
	lines := make([]string, 0, len(sets))
	for _, s := range sets {
		if err := checkWord("set name", s.Name); err != nil {
			return err
		}
		args, err := createArgs(s)
		if err != nil {
			return err
		}
		lines = append(lines, "create "+args)
	}
	return restore(len(lines), func(i int) string { return lines[i] })
}

// ChangeSets writes every change in one `ipset restore -exist`: with
// -exist (ipset 7) neither adding an entry that is there nor deleting one
// that is not fails.
func (ipsets) ChangeSets(changes []SetChange) error {
	for _, c := range changes {
		if err := checkWord("set name", c.Set); err != nil {
			return err
		}
		if err := checkWord("ipset entry", c.Entry); err != nil {
			return err
		}
	}
	return restore(len(changes), func(i int) string {
		op := "add "
		if changes[i].Delete {
			op = "del "
		}
		return op + changes[i].Set + " " + changes[i].Entry
	}, "-exist")
}

// savedEntries reads every set with one `ipset save` (`ipset list` takes
// one set per process) and keeps the named ones, entries as ipset prints
// them, sorted; a named set that does not exist has no key. SetEntries'
// fallback.
func savedEntries(names []string) (map[string][]string, error) {
	out, err := run(exec.Command("ipset", "save"))
	if err != nil {
		return nil, fmt.Errorf("ipset save: %w", err)
	}
	entries := make(map[string][]string, len(names))
	wanted := make(map[string]bool, len(names))
	for _, n := range names {
		wanted[n] = true
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "create NAME TYPE OPTIONS..." or "add NAME ENTRY [OPTIONS...]";
		// kube-proxy's entries have no options.
		fields := strings.Fields(sc.Text())
		if len(fields) < 3 || !wanted[fields[1]] {
			continue
		}
		switch fields[0] {
		case "create":
			entries[fields[1]] = []string{}
		case "add":
			entries[fields[1]] = append(entries[fields[1]], fields[2])
		}
	}
	for _, e := range entries {
		slices.Sort(e)
	}
	return entries, sc.Err()
}

// listHeader is ipset's IPSET_FLAG_LIST_HEADER: list each set's header
// (with its number of entries), not its entries.
const listHeader = 1 << 2

// setHeader is what the kernel tells of a set without its entries.
type setHeader struct {
	typ     SetType
	family  uint8 // NFPROTO_IPV4 or _IPV6; 0 for bitmap:port
	entries int
	// maxElem is a hash set's maxelem, ports a bitmap:port set's range.
	maxElem int
	ports   [2]uint16
}

// matches tells whether ipset's create of spec with -exist would take the
// set as it is: the same type, family and size.
func (h setHeader) matches(spec SetSpec) bool {
	if h.typ != spec.Type {
		return false
	}
	if spec.Type == BitmapPort {
		return h.ports == [2]uint16{0, 65535}
	}
	family := uint8(unix.NFPROTO_IPV4)
	if spec.IPv6 {
		family = unix.NFPROTO_IPV6
	}
	return h.family == family && h.maxElem == spec.Limit()
}

// allExist tells whether each of the sets exists as ipset would create it.
func allExist(headers map[string]setHeader, sets []SetSpec) bool {
	for _, s := range sets {
		if h, ok := headers[s.Name]; !ok || !h.matches(s) {
			return false
		}
	}
	return true
}

// setHeaders reads every set's header with one netlink dump (IPSET_CMD_LIST
// with the header-only flag, as `ipset list -t`) in the network namespace
// of the calling thread: no process, and a cost that does not grow with
// the entries (some 10k in KUBE-CLUSTER-IP at 10k services).
func setHeaders() (map[string]setHeader, error) {
	msgs, err := listSets(nl.NewRtAttr(int(nl.IPSET_ATTR_FLAGS|nl.NLA_F_NET_BYTEORDER), nl.BEUint32Attr(listHeader)))
	if err != nil {
		return nil, fmt.Errorf("listing the ipsets' headers: %w", err)
	}
	headers := make(map[string]setHeader, len(msgs))
	for _, msg := range msgs {
		name, h, err := parseSetHeader(msg)
		if err != nil {
			return nil, fmt.Errorf("listing the ipsets' headers: %w", err)
		}
		headers[name] = h
	}
	return headers, nil
}

// listSets dumps IPSET_CMD_LIST, what `ipset list` asks the kernel, with
// attrs after the protocol's (a set's name, the header-only flag), in the
// network namespace of the calling thread.
func listSets(attrs ...*nl.RtAttr) ([][]byte, error) {
	req := nl.NewNetlinkRequest(nl.IPSET_CMD_LIST|unix.NFNL_SUBSYS_IPSET<<8, unix.NLM_F_DUMP)
	req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_NETLINK, Version: nl.NFNETLINK_V0})
	req.AddData(nl.NewRtAttr(nl.IPSET_ATTR_PROTOCOL, nl.Uint8Attr(nl.IPSET_PROTOCOL)))
	for _, a := range attrs {
		req.AddData(a)
	}
	return req.Execute(unix.NETLINK_NETFILTER, 0)
}

// parseSetHeader reads a set's header: a nfgenmsg, then attributes, its
// numbers nested in IPSET_ATTR_DATA (in network order).
func parseSetHeader(msg []byte) (string, setHeader, error) {
	var h setHeader
	if len(msg) < nl.SizeofNfgenmsg {
		return "", h, fmt.Errorf("a message of %d bytes", len(msg))
	}
	attrs, err := nl.ParseRouteAttr(msg[nl.SizeofNfgenmsg:])
	if err != nil {
		return "", h, err
	}
	name := ""
	h.entries = -1
	for _, a := range attrs {
		switch a.Attr.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER) {
		case nl.IPSET_ATTR_SETNAME:
			name = strings.TrimRight(string(a.Value), "\x00")
		case nl.IPSET_ATTR_TYPENAME:
			h.typ = SetType(strings.TrimRight(string(a.Value), "\x00"))
		case nl.IPSET_ATTR_FAMILY:
			if len(a.Value) == 1 {
				h.family = a.Value[0]
			}
		case nl.IPSET_ATTR_DATA:
			data, err := nl.ParseRouteAttr(a.Value)
			if err != nil {
				return "", h, err
			}
			for _, d := range data {
				switch v := d.Value; {
				case len(v) == 4 && d.Attr.Type&^unix.NLA_F_NET_BYTEORDER == nl.IPSET_ATTR_ELEMENTS:
					h.entries = int(binary.BigEndian.Uint32(v))
				case len(v) == 4 && d.Attr.Type&^unix.NLA_F_NET_BYTEORDER == nl.IPSET_ATTR_MAXELEM:
					h.maxElem = int(binary.BigEndian.Uint32(v))
				case len(v) == 2 && d.Attr.Type&^unix.NLA_F_NET_BYTEORDER == nl.IPSET_ATTR_PORT_FROM:
					h.ports[0] = binary.BigEndian.Uint16(v)
				case len(v) == 2 && d.Attr.Type&^unix.NLA_F_NET_BYTEORDER == nl.IPSET_ATTR_PORT_TO:
					h.ports[1] = binary.BigEndian.Uint16(v)
				}
			}
		}
	}
	if name == "" || h.entries < 0 {
		return "", h, fmt.Errorf("a set header without a name or a number of entries (set %q)", name)
	}
	return name, h, nil
}

// SetSizes counts the named sets' entries from their headers (setHeaders:
// no process). A named set that does not exist has no key.
func (ipsets) SetSizes(names []string) (map[string]int, error) {
	headers, err := setHeaders()
	if err != nil {
		return nil, err
	}
	sizes := make(map[string]int, len(names))
	for _, name := range names {
		if h, ok := headers[name]; ok {
			sizes[name] = h.entries
		}
	}
	return sizes, nil
}

// checkWord refuses what would break the one-command-per-line restore
// format, or pass as another argument.
func checkWord(what, s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n\"") {
		return fmt.Errorf("invalid %s %q", what, s)
	}
	return nil
}

// lineError finds the line ipset restore names in its message.
var lineError = regexp.MustCompile(`Error in line (\d+): (.*)`)

// restore runs `ipset restore` on the lines; its error quotes the line
// ipset names (and with it the set), or, for the errors ipset reports
// without a line, the sets the input touched.
func restore(n int, line func(i int) string, args ...string) error {
	if n == 0 {
		return nil
	}
	cmd := exec.Command("ipset", append([]string{"restore"}, args...)...)
	// Made as ipset reads them: the input of a first sync at 10,000
	// services is some 30,000 lines, never held whole.
	cmd.Stdin = &linesReader{n: n, line: line}
	_, err := run(cmd)
	if err == nil {
		return nil
	}
	if m := lineError.FindStringSubmatch(err.Error()); m != nil {
		if i, _ := strconv.Atoi(m[1]); i >= 1 && i <= n {
			return fmt.Errorf("ipset restore: line %d %q: %s", i, line(i-1), m[2])
		}
	}
	var sets []string
	for i := range n {
		if f := strings.Fields(line(i)); len(f) > 1 && !slices.Contains(sets, f[1]) {
			sets = append(sets, f[1])
		}
	}
	return fmt.Errorf("ipset restore of %d lines on sets %s: %w", n, strings.Join(sets, ", "), err)
}

// linesReader reads n lines, each made by line when its turn comes.
type linesReader struct {
	n, next int
	line    func(i int) string
	// buf holds the line being read, pending what of it is left.
	buf, pending []byte
}

func (r *linesReader) Read(p []byte) (int, error) {
	read := 0
	for read < len(p) {
		if len(r.pending) == 0 {
			if r.next == r.n {
				break
			}
			r.buf = append(append(r.buf[:0], r.line(r.next)...), '\n')
			r.pending = r.buf
			r.next++
		}
		c := copy(p[read:], r.pending)
		r.pending, read = r.pending[c:], read+c
	}
	if read == 0 {
		return 0, io.EOF
	}
	return read, nil
}

// run runs the command and returns its output, or an error carrying its
// message.
func run(cmd *exec.Cmd) ([]byte, error) {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}
