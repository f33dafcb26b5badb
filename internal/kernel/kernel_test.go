package kernel

import (
	"errors"
	"strings"
	"testing"
)

func TestParseVersion(t *testing.T) {
	for release, want := range map[string]Version{
		"6.1.0-18-amd64":         {6, 1},
		"5.15.0-91-generic":      {5, 15},
		"5.13":                   {5, 13},
		"4.19-rc1":               {4, 19},
		"5.4.0+\n":               {5, 4},
		"6.12.9-200.fc41.x86_64": {6, 12},
	} {
		got, err := ParseVersion(release)
		if err != nil || got != want {
			t.Errorf("ParseVersion(%q) = %v, %v; want %v", release, got, err, want)
		}
	}
	for _, release := range []string{"", "6", "x.y", "linux-6.1", "6.x"} {
		if v, err := ParseVersion(release); err == nil {
			t.Errorf("ParseVersion(%q) = %v, want an error", release, v)
		}
	}
}

func TestAtLeast(t *testing.T) {
	min := Version{5, 13}
	for v, want := range map[Version]bool{
		{5, 13}: true, {5, 14}: true, {6, 0}: true, {5, 12}: false, {4, 19}: false,
	} {
		if got := v.AtLeast(min); got != want {
			t.Errorf("%v.AtLeast(%v) = %v, want %v", v, min, got, want)
		}
	}
}

func TestCheckNFTables(t *testing.T) {
	release := func(r string, err error) func() (string, error) {
		return func() (string, error) { return r, err }
	}
	for _, tc := range []struct {
		name, skip string
		release    func() (string, error)
		want       string // in the error; "" for none
	}{
		{"new enough", "", release("5.13.0-1-amd64", nil), ""},
		{"newer", "", release("6.12.9-200.fc41.x86_64", nil), ""},
		{"too old", "", release("5.10.0-28-amd64", nil), "requires kernel 5.13 or later (this is 5.10.0-28-amd64; set KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK"},
		{"too old, check skipped", "1", release("4.19.0", nil), ""},
		{"unreadable", "", release("", errors.New("no /proc")), "could not check kernel version: no /proc"},
		{"unparsable", "", release("linux", nil), "could not check kernel version"},
	} {
		err := CheckNFTables(tc.skip, tc.release)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}
