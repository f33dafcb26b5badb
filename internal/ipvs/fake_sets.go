package ipvs

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// fakeSet is one of the Fake's ipsets, which EnsureSets, ChangeSets,
// SetEntries and SetSizes treat as `ipset restore` and `ipset list` do.
type fakeSet struct {
	spec    SetSpec
	entries map[string]bool
}

// EnsureSets creates the missing sets in order, as the lines of one
// `ipset restore`: a set that exists with another type or family fails,
// after the sets before it were created.
func (f *Fake) EnsureSets(sets []SetSpec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("EnsureSets"); err != nil {
		return err
	}
	for i, spec := range sets {
		line, err := createArgs(spec)
		if err == nil {
			err = checkSetName(spec.Name)
		}
		// ipset takes the same create line again, and only that (a
		// bitmap:port has no family).
		if s := f.sets[spec.Name]; err == nil && s != nil {
			if existing, _ := createArgs(s.spec); existing != line {
				err = errors.New("set cannot be created: set with the same name already exists")
			}
		}
		if err != nil {
			return fmt.Errorf("ipset restore: line %d %q: %v", i+1, "create "+line, err)
		}
		if f.sets[spec.Name] == nil {
			f.sets[spec.Name] = &fakeSet{spec: spec, entries: map[string]bool{}}
		}
	}
	return nil
}

// checkSetName applies ipset's limit: 31 characters.
func checkSetName(name string) error {
	if err := checkWord("set name", name); err != nil {
		return err
	}
	if len(name) > 31 {
		return fmt.Errorf("setname %q is longer than 31 characters", name)
	}
	return nil
}

func (f *Fake) SetEntries(names []string) (map[string][]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetEntries"); err != nil {
		return nil, err
	}
	entries := map[string][]string{}
	for _, n := range names {
		if s := f.sets[n]; s != nil {
			entries[n] = slices.Sorted(maps.Keys(s.entries))
		}
	}
	return entries, nil
}

func (f *Fake) SetSizes(names []string) (map[string]int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetSizes"); err != nil {
		return nil, err
	}
	sizes := map[string]int{}
	for _, n := range names {
		if s := f.sets[n]; s != nil {
			sizes[n] = len(s.entries)
		}
	}
	return sizes, nil
}

// ChangeSets applies the changes in order, as the lines of one `ipset
// restore -exist`: the first bad line fails, after the lines before it
// were applied.
func (f *Fake) ChangeSets(changes []SetChange) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("ChangeSets"); err != nil {
		return err
	}
	for i, c := range changes {
		op := "add"
		if c.Delete {
			op = "del"
		}
		if err := f.change(c); err != nil {
			return fmt.Errorf("ipset restore: line %d %q: %v", i+1, op+" "+c.Set+" "+c.Entry, err)
		}
	}
	return nil
}

func (f *Fake) change(c SetChange) error {
	s := f.sets[c.Set]
	if s == nil {
		return errors.New("the set with the given name does not exist")
	}
	entry, err := canonicalEntry(s.spec.Type, s.spec.IPv6, c.Entry)
	if err != nil {
		return err
	}
	switch {
	case c.Delete:
		delete(s.entries, entry)
	case s.entries[entry]:
	case s.spec.Limit() > 0 && len(s.entries) >= s.spec.Limit():
		// ipset's words (ipset 7.17 on Linux 6.18). A large kernel set
		// takes a few entries past maxelem; the fake none.
		return errors.New("Hash is full, cannot add more elements")
	default:
		s.entries[entry] = true
	}
	return nil
}
