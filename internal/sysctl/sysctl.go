// Package sysctl reads and writes kernel parameters under /proc/sys (and
// module parameters under /sys/module).
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Interface reads and writes integer kernel parameters by path, e.g.
// "net/netfilter/nf_conntrack_max" or "/sys/module/nf_conntrack/parameters/hashsize".
type Interface interface {
	Get(name string) (int, error)
	Set(name string, value int) error
}

// Proc is the real /proc/sys.
type Proc struct{}

func path(name string) string {
	if filepath.IsAbs(name) {
		return name
	}
	return filepath.Join("/proc/sys", name)
}

// Get reads a parameter.
func (Proc) Get(name string) (int, error) {
	data, err := os.ReadFile(path(name))
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return v, nil
}

// Set writes a parameter.
func (Proc) Set(name string, value int) error {
	return os.WriteFile(path(name), []byte(strconv.Itoa(value)), 0o640)
}

// Fake is an in-memory Interface for tests; ReadOnly names fail on Set.
type Fake struct {
	Values   map[string]int
	ReadOnly map[string]bool
}

// Get reads a value, failing for unknown names as the kernel would.
func (f *Fake) Get(name string) (int, error) {
	v, ok := f.Values[name]
	if !ok {
		return 0, fmt.Errorf("%s: no such parameter", name)
	}
	return v, nil
}

// Set writes a value unless it is read-only.
func (f *Fake) Set(name string, value int) error {
	if f.ReadOnly[name] {
		return fmt.Errorf("%s: read-only file system", name)
	}
	if f.Values == nil {
		f.Values = map[string]int{}
	}
	f.Values[name] = value
	return nil
}
