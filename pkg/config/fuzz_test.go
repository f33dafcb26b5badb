package config

import (
	"testing"
)

// FuzzDecode feeds arbitrary files to the loader: each one is refused with
// a message, or gives a configuration that validation judges field by
// field and that writes back as itself. Seeds: testdata/fuzz/FuzzDecode.
func FuzzDecode(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Decode(data)
		if err != nil {
			if cfg != nil || err.Error() == "" {
				t.Fatalf("a refusal must say why and return nothing: config %v, error %q", cfg, err)
			}
			return
		}
		for _, e := range Validate(cfg) {
			if e.Field == "" || e.Error() == "" {
				t.Errorf("a validation error names no field or says nothing: %#v", e)
			}
		}
		written, err := Marshal(cfg)
		if err != nil {
			t.Fatalf("a decoded configuration does not write: %v", err)
		}
		again, err := Decode(written)
		if err != nil {
			t.Fatalf("a written configuration does not decode: %v\n%s", err, written)
		}
		if rewritten, _ := Marshal(again); string(rewritten) != string(written) {
			t.Fatalf("writing changed the configuration:\n%s\n---\n%s", written, rewritten)
		}
	})
}
