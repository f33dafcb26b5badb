package nftables

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/rapidproxy/rapidproxy/internal/nftnl"
)

// netlinkTx is a transaction's operations on the family's table, which
// holds sets after it, encoded for the netlink writer, or an error
// wrapping nftnl.ErrUnsupported, before anything is sent, for one it
// does not encode.
func netlinkTx(family knftables.Family, p txPlan, sets tableSets) (*nftnl.Writer, error) {
	w, err := nftnl.NewWriter(string(family), TableName, setType(sets))
	if err != nil {
		return nil, err
	}
	for _, r := range p {
		for i := r.from; i < r.to; i++ {
			if err := encodeOp(w, r.verb, r.at(i)); err != nil {
				return nil, err
			}
		}
	}
	return w, nil
}

// setType is the type and flags of a set the table holds, as the
// writer's elements are typed by.
func setType(sets tableSets) func(name string) (string, []string, bool) {
	return func(name string) (string, []string, bool) {
		ts := sets.set(name)
		if ts == nil {
			return "", nil, false
		}
		flags := make([]string, len(ts.Flags))
		for i, f := range ts.Flags {
			flags[i] = string(f)
		}
		return ts.Type, flags, true
	}
}

func unsupportedOp(v verb, obj knftables.Object) error {
	return fmt.Errorf("%w: %s %T %+v", nftnl.ErrUnsupported, v, obj, obj)
}

// encodeOp adds one operation to the writer: the objects and fields the
// syncer writes, and nothing else.
func encodeOp(w *nftnl.Writer, v verb, obj knftables.Object) error {
	switch o := obj.(type) {
	case *knftables.Table:
		switch {
		case o.Family != "" || o.Name != "" || len(o.Flags) > 0 || o.Handle != nil:
		case v == addOp:
			return w.AddTable(orEmpty(o.Comment))
		case v == deleteOp:
			return w.DeleteTable()
		}
	case *knftables.Chain:
		return chainOp(w, v, o)
	case *knftables.Set:
		if o.Family == "" && o.Table == "" && o.TypeOf == "" && o.GCInterval == nil && o.Size == nil && o.Policy == nil && o.AutoMerge == nil && o.Handle == nil {
			return setOp(w, v, o.Name, false, o.Type, o.Flags, o.Timeout, orEmpty(o.Comment))
		}
	case *knftables.Map:
		if o.Family == "" && o.Table == "" && o.TypeOf == "" && o.GCInterval == nil && o.Size == nil && o.Policy == nil && o.Handle == nil {
			return setOp(w, v, o.Name, true, o.Type, o.Flags, o.Timeout, orEmpty(o.Comment))
		}
	case *knftables.Rule:
		if o.Family == "" && o.Table == "" && o.Index == nil && o.Handle == nil && v == addOp {
			rule := o.Rule
			if o.Comment != nil {
				rule += " comment " + strconv.Quote(*o.Comment)
			}
			return w.AddRule(o.Chain, rule)
		}
	case *knftables.Counter:
		switch {
		case o.Family != "" || o.Table != "" || o.Comment != nil || o.Packets != nil || o.Bytes != nil || o.Handle != nil:
		case v == addOp:
			return w.AddCounter(o.Name)
		case v == deleteOp:
			return w.DeleteCounter(o.Name)
		}
	case *knftables.Element:
		name := o.Set + o.Map
		switch {
		case o.Family != "" || o.Table != "" || o.Set != "" && o.Map != "":
		case v == addOp:
			return w.AddElement(name, nftnl.Element{Key: strings.Join(o.Key, " . "), Value: strings.Join(o.Value, " . "), Comment: orEmpty(o.Comment)})
		case v == deleteOp:
			return w.DeleteElement(name, strings.Join(o.Key, " . "))
		}
	}
	return unsupportedOp(v, obj)
}

func chainOp(w *nftnl.Writer, v verb, o *knftables.Chain) error {
	switch {
	case o.Family != "" || o.Table != "" || o.Policy != nil || o.Device != nil || o.Handle != nil:
	case v == addOp:
		c := nftnl.Chain{Name: o.Name, Comment: orEmpty(o.Comment)}
		if o.Hook != nil || o.Type != nil || o.Priority != nil {
			if o.Hook == nil || o.Type == nil || o.Priority == nil {
				return unsupportedOp(v, o)
			}
			c.Base = &nftnl.BaseChain{Type: string(*o.Type), Hook: string(*o.Hook), Priority: string(*o.Priority)}
		}
		return w.AddChain(c)
	case v == flushOp:
		return w.FlushChain(o.Name)
	case v == deleteOp:
		return w.DeleteChain(o.Name)
	}
	return unsupportedOp(v, o)
}

// orEmpty is *p, or "" when p is nil.
func orEmpty(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func setOp(w *nftnl.Writer, v verb, name string, isMap bool, typ string, flags []knftables.SetFlag, timeout *time.Duration, comment string) error {
	switch v {
	case addOp:
		s := nftnl.Set{Name: name, Map: isMap, Type: typ, Comment: comment}
		for _, f := range flags {
			s.Flags = append(s.Flags, string(f))
		}
		if timeout != nil {
			s.Timeout = *timeout
		}
		return w.AddSet(s)
	case deleteOp:
		return w.DeleteSet(name)
	}
	return fmt.Errorf("%w: %s set %s", nftnl.ErrUnsupported, v, name)
}
