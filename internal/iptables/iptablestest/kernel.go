// Package iptablestest is a fake of the iptables tools for the tests of
// the modes that write iptables rules.
package iptablestest

import (
	"io"
	"strings"
)

// SavedKernel holds fixed iptables-save output and records the restores
// into it, each after a "# restore" line; TableGeneration is every
// table's generation, Saves counts the reads.
type SavedKernel struct {
	Saved           string
	Written         strings.Builder
	TableGeneration uint64
	Saves           int
}

func (k *SavedKernel) Restore(input io.Reader) error {
	k.Written.WriteString("# restore\n")
	_, err := io.Copy(&k.Written, input)
	return err
}

func (k *SavedKernel) Save(read func(io.Reader) error) error {
	k.Saves++
	return read(strings.NewReader(k.Saved))
}

func (k *SavedKernel) Generation(string) (uint64, error) { return k.TableGeneration, nil }

// ListRules lists a chain's rules as the saved output holds them.
func (k *SavedKernel) ListRules(table, chain string) ([]string, error) {
	var rules []string
	inTable := false
	for _, line := range strings.Split(k.Saved, "\n") {
		if name, ok := strings.CutPrefix(line, "*"); ok {
			inTable = name == table
		} else if rule, ok := strings.CutPrefix(line, "-A "+chain+" "); ok && inTable {
			rules = append(rules, rule)
		}
	}
	return rules, nil
}
