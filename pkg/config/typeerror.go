package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
)

// typeError rewrites the decoder's error for a value of the wrong type
// (Go's "json: cannot unmarshal string into Go struct field
// KubeProxyConntrackConfiguration.conntrack.maxPerCore of type int32") as
// the other errors read: the field's path as the file spells it, the value
// given and what the field wants, e.g.
//
//	conntrack.maxPerCore: invalid value "lots": want an integer (int32)
//
// Any other error is returned as it is.
func typeError(jsonData []byte, err error) error {
	var te *json.UnmarshalTypeError
	if !errors.As(err, &te) || te.Field == "" || te.Type == nil {
		return err
	}
	var doc any
	dec := json.NewDecoder(bytes.NewReader(jsonData))
	dec.UseNumber() // numbers as written
	if dec.Decode(&doc) != nil {
		return err
	}
	kind, _, _ := strings.Cut(te.Value, " ") // "number 3.5" is a number
	path, value, ok := findValue(doc, strings.Split(te.Field, "."), kind, "")
	if !ok {
		path, value = te.Field, nil
	}
	want := wantType(te.Type)
	if n, isNumber := value.(json.Number); isNumber {
		if _, err := n.Int64(); err == nil || !strings.ContainsAny(n.String(), ".eE") {
			want = wantRange(te.Type, want) // an integer, too large or small
		}
	}
	for _, duration := range durationFields {
		if te.Field == strings.Join(duration, ".") {
			want = "a duration (a number and a unit, e.g. 30s, 5m, 1h)"
		}
	}
	return fmt.Errorf("%s: invalid value %s: want %s", path, showValue(value, te.Value), want)
}

// findValue follows keys from v to the value of the JSON kind the decoder
// refused, and returns its path: the decoder names a map or list, not
// which of its elements is wrong, so those are searched.
func findValue(v any, keys []string, kind, at string) (string, any, bool) {
	join := func(key string) string {
		if at == "" {
			return key
		}
		return at + "." + key
	}
	if len(keys) == 0 {
		if jsonKind(v) == kind {
			return at, v, true
		}
		switch c := v.(type) {
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(c)) {
				if jsonKind(c[k]) == kind {
					return join(k), c[k], true
				}
			}
		case []any:
			for i, e := range c {
				if jsonKind(e) == kind {
					return fmt.Sprintf("%s[%d]", at, i), e, true
				}
			}
		}
		return "", nil, false
	}
	switch c := v.(type) {
	case map[string]any:
		if child, ok := c[keys[0]]; ok {
			return findValue(child, keys[1:], kind, join(keys[0]))
		}
	case []any:
		for i, e := range c {
			if path, value, ok := findValue(e, keys, kind, fmt.Sprintf("%s[%d]", at, i)); ok {
				return path, value, true
			}
		}
	}
	return "", nil, false
}

// jsonKind is the kind of a decoded JSON value as the decoder's errors
// name it.
func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "bool"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return "null"
}

// showValue writes a value as the file gives it; kind (the decoder's
// description) stands in if it was not found.
func showValue(v any, kind string) string {
	switch v := v.(type) {
	case string:
		return fmt.Sprintf("%q", v)
	case json.Number:
		return v.String()
	case bool:
		return fmt.Sprint(v)
	case map[string]any, []any:
		if text, err := json.Marshal(v); err == nil && len(text) <= 60 {
			return string(text)
		}
		if _, ok := v.([]any); ok {
			return "(a list)"
		}
		return "(a mapping)"
	}
	return "(" + kind + ")"
}

// wantRange is want with the range of t's integers.
func wantRange(t reflect.Type, want string) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	bits := t.Bits
	switch t.Kind() {
	case reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("an integer from %d to %d (%s)", -(int64(1) << (bits() - 1)), int64(1)<<(bits()-1)-1, t.Kind())
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return fmt.Sprintf("an integer from 0 to %d (%s)", uint64(1)<<bits()-1, t.Kind())
	}
	return want
}

// wantType says what a field of type t takes, in the file's terms.
func wantType(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Pointer:
		return wantType(t.Elem())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return fmt.Sprintf("an integer (%s)", t.Kind())
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return fmt.Sprintf("an integer of 0 or more (%s)", t.Kind())
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "a mapping"
	}
	return t.String()
}
