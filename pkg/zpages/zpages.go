// Package zpages serves upstream's /flagz and /statusz: the command line's
// flags with their values, and when the process started, its versions and
// the metrics server's paths. A plain GET gets the text form, for people;
// an Accept header asks, as upstream's z-pages negotiate it, for the text
// or for the kinds Flagz and Statusz of config.k8s.io (v1beta1, or the
// deprecated v1alpha1) as JSON or YAML, and anything else is answered 406
// with a Status, as upstream answers it.
package zpages

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rapidproxy/rapidproxy/pkg/version"
)

// Pages serves both pages of one process.
type Pages struct {
	flags   map[string]string
	started time.Time
}

// New returns the pages of a process started now with these flag values.
func New(flags map[string]string) *Pages {
	return &Pages{flags: flags, started: time.Now()}
}

// componentName is metadata.name of both kinds and the text's title.
const componentName = "kube-proxy"

// textHeader is upstream's first lines of each page's text.
const textHeader = `
kube-proxy %s
Warning: This endpoint is not meant to be machine parseable, has no formatting compatibility guarantees and is for debugging purposes only.
`

// delimiter is, as upstream's, one of several separators of the text,
// picked per request so that nobody parses it.
func delimiter() string { return []string{":", ": ", "=", " "}[rand.IntN(4)] }

// typeMeta and objectMeta are the fields of both kinds that say what they
// are, as upstream encodes them.
type typeMeta struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
}

type objectMeta struct {
	Name string `json:"name"`
}

// flagz is the kind Flagz, the same in both versions.
type flagz struct {
	typeMeta `json:",inline"`
	Metadata objectMeta        `json:"metadata"`
	Flags    map[string]string `json:"flags,omitempty"`
}

// statusz is the kind Statusz, the same in both versions.
type statusz struct {
	typeMeta         `json:",inline"`
	Metadata         objectMeta  `json:"metadata"`
	StartTime        metav1.Time `json:"startTime"`
	UptimeSeconds    int64       `json:"uptimeSeconds"`
	GoVersion        string      `json:"goVersion"`
	BinaryVersion    string      `json:"binaryVersion"`
	EmulationVersion string      `json:"emulationVersion,omitempty"`
	Paths            []string    `json:"paths"`
}

// Flagz serves /flagz.
func (p *Pages) Flagz(w http.ResponseWriter, r *http.Request) {
	serve(w, r, "Flagz", func(w http.ResponseWriter) {
		fmt.Fprintf(w, textHeader, "flagz")
		delim := delimiter()
		for _, name := range p.flagNames() {
			fmt.Fprintf(w, "%s%s%s\n", name, delim, p.flags[name])
		}
	}, func(apiVersion string) any {
		return flagz{typeMeta{"Flagz", apiVersion}, objectMeta{componentName}, p.flags}
	})
}

func (p *Pages) flagNames() []string {
	names := make([]string, 0, len(p.flags))
	for name := range p.flags {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// statuszPaths are the top-level paths upstream's statusz lists.
var statuszPaths = []string{"/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"}

// Statusz serves /statusz.
func (p *Pages) Statusz(w http.ResponseWriter, r *http.Request) {
	up := max(0, int64(time.Since(p.started).Seconds()))
	compatible := strings.TrimPrefix(version.KubernetesCompatible, "v")
	emulation := compatible[:strings.LastIndex(compatible, ".")]
	binary := version.Get().GitVersion
	serve(w, r, "Statusz", func(w http.ResponseWriter) {
		fmt.Fprintf(w, textHeader, "statusz")
		fmt.Fprintf(w, "\nStarted%[1]s %[2]s\nUp%[1]s %[3]d hr %02[4]d min %02[5]d sec\nGo version%[1]s %[6]s\nBinary version%[1]s %[7]s\nEmulation version%[1]s %[8]s\nPaths%[1]s %[9]s\n",
			delimiter(), p.started.Format(time.UnixDate), up/3600, up/60%60, up%60,
			runtime.Version(), binary, emulation, strings.Join(statuszPaths, " "))
	}, func(apiVersion string) any {
		return statusz{
			typeMeta: typeMeta{"Statusz", apiVersion}, Metadata: objectMeta{componentName},
			StartTime: metav1.NewTime(p.started), UptimeSeconds: up, GoVersion: runtime.Version(),
			BinaryVersion: binary, EmulationVersion: emulation, Paths: statuszPaths,
		}
	})
}

// serve answers one request for a page of the kind: its text, or the
// object of the version the Accept header asks for, or 406.
func serve(w http.ResponseWriter, r *http.Request, kind string, text func(http.ResponseWriter), object func(apiVersion string) any) {
	accept := r.Header.Get("Accept")
	if strings.TrimSpace(accept) == "" {
		writeText(w, text)
		return
	}
	f, ok := negotiate(accept, kind)
	switch {
	case !ok:
		notAcceptable(w, r, accept)
	case f.mediaType == textPlain:
		writeText(w, text)
	default:
		if deprecatedVersions[f.version] {
			w.Header().Set("Warning", fmt.Sprintf(`299 - "This version of the %s endpoint is deprecated. Please use a newer version."`, strings.ToLower(kind)))
		}
		contentType := fmt.Sprintf("%s;g=%s;v=%s;as=%s", f.mediaType, group, f.version, kind)
		write(w, r, f, contentType, http.StatusOK, object(group+"/"+f.version))
	}
}

func writeText(w http.ResponseWriter, text func(http.ResponseWriter)) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	text(w)
}
