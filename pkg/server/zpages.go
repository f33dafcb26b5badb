package server

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/rapidproxy/rapidproxy/pkg/version"
)

// zPages are upstream's /flagz and /statusz in their text form (the one a
// plain GET gets): the command line's flags with their values, and when
// the process started, its versions and the metrics server's paths.
type zPages struct {
	flags   map[string]string
	started time.Time
}

func newZPages(flags map[string]string) zPages {
	return zPages{flags: flags, started: time.Now()}
}

// zPagesHeader is upstream's first lines of each page.
const zPagesHeader = `
kube-proxy %s
Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.
`

// zPagesDelimiter is, as upstream's, one of several separators, picked per
// request so that nobody parses the page.
func zPagesDelimiter() string { return []string{":", ": ", "=", " "}[rand.IntN(4)] }

func (z zPages) flagz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, zPagesHeader, "flagz")
	delim := zPagesDelimiter()
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for name := range z.flags {
			if !yield(name) {
				return
			}
		}
	}) {
		fmt.Fprintf(w, "%s%s%s\n", name, delim, z.flags[name])
	}
}

// statuszPaths are the top-level paths upstream's statusz lists.
var statuszPaths = []string{"/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"}

func (z zPages) statusz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, zPagesHeader, "statusz")
	up := int64(time.Since(z.started).Seconds())
	compatible := strings.TrimPrefix(version.KubernetesCompatible, "v")
	emulation := compatible[:strings.LastIndex(compatible, ".")]
	fmt.Fprintf(w, "\nStarted%[1]s %[2]s\nUp%[1]s %[3]d hr %02[4]d min %02[5]d sec\nGo version%[1]s %[6]s\nBinary version%[1]s %[7]s\nEmulation version%[1]s %[8]s\nPaths%[1]s %[9]s\n",
		zPagesDelimiter(), z.started.Format(time.UnixDate), up/3600, up/60%60, up%60,
		runtime.Version(), version.Get().GitVersion, emulation, strings.Join(statuszPaths, " "))
}
