// Package kernel reads the running kernel's release and compares it with
// the versions the proxy modes need.
package kernel

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Release is the running kernel's release ("6.1.0-18-amd64").
func Release() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "", fmt.Errorf("reading the kernel release: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Version is a kernel's major and minor version.
type Version struct{ Major, Minor int }

func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// AtLeast tells whether v is min or later.
func (v Version) AtLeast(min Version) bool {
	return v.Major > min.Major || v.Major == min.Major && v.Minor >= min.Minor
}

// ParseVersion reads the major and minor version at the start of a
// release ("5.15.0-91-generic", "6.8", "4.19-rc1").
func ParseVersion(release string) (Version, error) {
	parts := strings.SplitN(strings.TrimSpace(release), ".", 3)
	if len(parts) < 2 {
		return Version{}, fmt.Errorf("kernel release %q: no major.minor version", release)
	}
	major, err1 := strconv.Atoi(parts[0])
	// The minor version may run into the rest ("19-rc1", "4+").
	digits := strings.IndexFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' })
	if digits < 0 {
		digits = len(parts[1])
	}
	minor, err2 := strconv.Atoi(parts[1][:digits])
	if err1 != nil || err2 != nil {
		return Version{}, fmt.Errorf("kernel release %q: no major.minor version", release)
	}
	return Version{Major: major, Minor: minor}, nil
}

// SkipNFTablesCheckEnv, set to anything, lets the nftables mode run on a
// kernel older than NFTablesMin, as upstream's.
const SkipNFTablesCheckEnv = "KUBE_PROXY_NFTABLES_SKIP_KERNEL_VERSION_CHECK"

// NFTablesMin is the oldest kernel upstream runs the nftables mode on: it
// stands for a distribution whose own nft is 1.0.1 or later, which the
// rules kube-proxy writes do not break.
var NFTablesMin = Version{Major: 5, Minor: 13}

// CheckNFTables is upstream's kernel check for the nftables mode: skipped
// when skip (the value of SkipNFTablesCheckEnv) is set, else the kernel
// release must be NFTablesMin or later.
func CheckNFTables(skip string, release func() (string, error)) error {
	if skip != "" {
		return nil
	}
	r, err := release()
	if err != nil {
		return fmt.Errorf("could not check kernel version: %w", err)
	}
	v, err := ParseVersion(r)
	if err != nil {
		return fmt.Errorf("could not check kernel version: %w", err)
	}
	if !v.AtLeast(NFTablesMin) {
		return fmt.Errorf("kube-proxy in nftables mode requires kernel %s or later (this is %s; set %s to skip this check)", NFTablesMin, r, SkipNFTablesCheckEnv)
	}
	return nil
}
