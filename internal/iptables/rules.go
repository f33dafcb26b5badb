package iptables

import (
	"io"
	"strings"
)

// Kernel is what the modes need from the iptables tools of one family;
// Runner is the real one.
type Kernel interface {
	// Restore applies iptables-restore --noflush input, atomically per table.
	Restore(input io.Reader) error
	// Save hands iptables-save output of every table to read as the tool
	// prints it: one dump costs no more than one table's on nft, which
	// fetches the whole ruleset anyway, and it is never held whole (some
	// 18 MB at 10k services).
	Save(read func(io.Reader) error) error
	// ListRules returns a chain's rules without "-A CHAIN"; an error
	// when the chain does not exist.
	ListRules(table, chain string) ([]string, error)
	// Generation changes whenever the rules of the table may have
	// changed; reading it is far cheaper than listing rules.
	Generation(table string) (uint64, error)
}

// Chain is an iptables chain name.
type Chain string

// Table is an iptables table.
type Table string

const (
	TableFilter Table = "filter"
	TableNAT    Table = "nat"
	TableMangle Table = "mangle"
)

// KubeTables are the tables kube-proxy writes to, in the order it writes
// and reads them.
var KubeTables = []Table{TableMangle, TableFilter, TableNAT}

// Rule is one rule in iptables-restore syntax, without "-A CHAIN".
type Rule string

// OwnChain is a chain with its whole content.
type OwnChain struct {
	Name  Chain
	Rules []Rule
	// Unordered says the rules' order does not matter, each matching
	// packets no other does: a ChainSet leaves the chain as it is when
	// the kernel holds the same rules in another order.
	Unordered bool
}

// Jump is a rule in a built-in chain that leads into one of ours.
type Jump struct {
	Table Table
	From  Chain
	Rule  Rule
}

// BuiltinChains are the kernel's own chains, which hold our jumps.
var BuiltinChains = map[Chain]bool{"PREROUTING": true, "INPUT": true, "FORWARD": true, "OUTPUT": true, "POSTROUTING": true}

// JumpTarget is the chain a rule (its arguments after "-A CHAIN") jumps
// or goes to, "" if none.
func JumpTarget(rule string) Chain {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" {
			return Chain(f[i+1])
		}
	}
	return ""
}

// SameRule tells whether two rules mean the same, each as written or as
// iptables-save prints it.
func SameRule(a, b Rule) bool { return CanonicalRule(a) == CanonicalRule(b) }

// Args splits a rule, as written or as iptables-save prints it, into its
// arguments, unquoting the quoted ones.
func Args(r Rule) []string { return appendArgs(nil, r) }

// appendArgs appends the arguments of r to args.
func appendArgs(args []string, r Rule) []string {
	s := string(r)
	for len(s) > 0 {
		s = strings.TrimLeft(s, " ")
		if s == "" {
			break
		}
		if s[0] == '"' {
			if arg, rest, ok := unquoteArg(s); ok {
				args = append(args, arg)
				s = rest
				continue
			}
		}
		end := strings.IndexByte(s, ' ')
		if end < 0 {
			end = len(s)
		}
		args = append(args, s[:end])
		s = s[end:]
	}
	return args
}

// unquoteArg takes the double-quoted argument s starts with, as
// iptables-save quotes it: a backslash escapes the next character (it
// prints a comment's ' as \', which Go's unquoting rejects).
func unquoteArg(s string) (arg, rest string, ok bool) {
	// Most quoted arguments (every rule's comment) escape nothing: those
	// are returned as they are, without a copy.
	if end := strings.IndexAny(s[1:], "\"\\"); end >= 0 && s[1+end] == '"' {
		return s[1 : 1+end], s[2+end:], true
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 < len(s) {
				i++
				b.WriteByte(s[i])
			}
		case '"':
			return b.String(), s[i+1:], true
		default:
			b.WriteByte(s[i])
		}
	}
	return "", s, false
}
