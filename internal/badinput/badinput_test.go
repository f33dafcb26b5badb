package badinput

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the seed corpora from Cases")

// seedCorpora are the fuzz targets that take these objects.
var seedCorpora = []string{
	"../../pkg/state/testdata/fuzz/FuzzEndpointSlices",
	"../../pkg/iptables/testdata/fuzz/FuzzServiceRules",
	"../../pkg/nftables/testdata/fuzz/FuzzServiceObjects",
	"../../pkg/ipvs/testdata/fuzz/FuzzServiceObjects",
}

// TestSeedCorporaAreTheCases checks that each fuzz target's seed corpus
// holds every case, in Go's corpus file format (-update rewrites them).
// Other files there, such as crashers kept as seeds, are left alone.
func TestSeedCorporaAreTheCases(t *testing.T) {
	for _, dir := range seedCorpora {
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range Cases() {
			path := filepath.Join(dir, tc.Name)
			want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", tc.Encode())
			if *update {
				if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if got, err := os.ReadFile(path); err != nil || string(got) != want {
				t.Errorf("%s is not case %s (go test ./internal/badinput -update rewrites it): %v", path, tc.Name, err)
			}
		}
	}
}

func TestEncodedCasesDecodeAsThemselves(t *testing.T) {
	for _, tc := range append(Cases(), Case{Name: "good", Objects: Good()}) {
		got, ok := Decode(tc.Encode())
		if !ok || !reflect.DeepEqual(got, tc.Objects) {
			t.Errorf("%s: decodes as %+v", tc.Name, got)
		}
	}
	if _, ok := Decode([]byte("not json")); ok {
		t.Error("garbage decodes")
	}
}
