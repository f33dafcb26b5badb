package zpages

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/munnerz/goautoneg"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The media types both pages serve, in the order upstream's codec factory
// lists them: a clause matching several ("*/*") gets the first that fits.
const (
	applicationJSON = "application/json"
	applicationYAML = "application/yaml"
	textPlain       = "text/plain"
)

var mediaTypes = []string{applicationJSON, applicationYAML, textPlain}

// group is the API group of both kinds; deprecatedVersions has each of
// their versions, true for one whose answer carries a deprecation warning.
const group = "config.k8s.io"

var deprecatedVersions = map[string]bool{"v1alpha1": true, "v1beta1": false}

// form is what a request gets: a media type and, for JSON and YAML, the
// version of the kind.
type form struct {
	mediaType string
	version   string
	// pretty asks for indented JSON.
	pretty bool
}

// negotiate picks the form of the page of kind the Accept header asks
// for, as upstream's does: the first clause, by quality and then
// specificity, with a media type served in an allowed form. Text is allowed
// without a kind; JSON and YAML only as a version of the page's kind
// (";g=config.k8s.io;v=v1beta1;as=Flagz").
func negotiate(accept, kind string) (form, bool) {
	return firstAllowed(accept, func(mediaType string, target *gvk) bool {
		if mediaType == textPlain {
			return target == nil
		}
		if target == nil || target.group != group || target.kind != kind {
			return false
		}
		_, known := deprecatedVersions[target.version]
		return known
	}, func(string, string) bool { return false })
}

// gvk is the group, version and kind a clause's "g", "v" and "as" name.
type gvk struct{ group, version, kind string }

// firstAllowed is the first form of a clause of accept that allowed
// permits, with a stream (";stream=") only where streams permits it.
func firstAllowed(accept string, allowed func(mediaType string, target *gvk) bool, streams func(mediaType, stream string) bool) (form, bool) {
	for _, clause := range goautoneg.ParseAccept(accept) {
		for _, mediaType := range mediaTypes {
			typ, sub, _ := strings.Cut(mediaType, "/")
			if clause.Type == "*" && clause.SubType == "*" || clause.Type == typ && (clause.SubType == sub || clause.SubType == "*") {
				if f, ok := clauseForm(clause.Params, mediaType, allowed, streams); ok {
					return f, true
				}
			}
		}
	}
	return form{}, false
}

// clauseForm is the form a clause's parameters ask for in mediaType, if
// allowed: upstream's parameters ("as", "g", "v", "pretty"; "stream" and
// "sv" refused unless permitted; others ignored).
func clauseForm(params map[string]string, mediaType string, allowed func(string, *gvk) bool, streams func(string, string) bool) (form, bool) {
	f := form{mediaType: mediaType}
	var target *gvk
	for key, value := range params {
		switch key {
		case "as", "g", "v":
			if target == nil {
				target = &gvk{}
			}
			switch key {
			case "as":
				target.kind = value
			case "g":
				target.group = value
			default:
				target.version = value
			}
		case "stream":
			if value != "" && !streams(mediaType, value) {
				return form{}, false
			}
		case "sv":
			if value != "" {
				return form{}, false
			}
		case "pretty":
			f.pretty = value == "1"
		}
	}
	if !allowed(mediaType, target) {
		return form{}, false
	}
	if target != nil {
		f.version = target.version
	}
	return f, true
}

// notAcceptable answers 406 with a Status, as upstream's: in JSON or YAML
// if the Accept header takes one of them without a kind (as any API
// error's form is negotiated), else as indented JSON.
func notAcceptable(w http.ResponseWriter, r *http.Request, accept string) {
	status := &metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  "only the following media types are accepted: " + strings.Join(mediaTypes, ", "),
		Reason:   metav1.StatusReasonNotAcceptable,
		Code:     http.StatusNotAcceptable,
	}
	f, ok := firstAllowed(accept, func(mediaType string, target *gvk) bool {
		return target == nil && mediaType != textPlain // text has no form of a Status
	}, func(mediaType, stream string) bool {
		return mediaType == applicationJSON && stream == "watch"
	})
	if !ok {
		body, _ := json.MarshalIndent(status, "", "  ")
		w.Header().Set("Content-Type", applicationJSON)
		w.WriteHeader(http.StatusNotAcceptable)
		_, _ = w.Write(body)
		return
	}
	write(w, r, f, f.mediaType, http.StatusNotAcceptable, status)
}

// write encodes obj in the form: YAML, or JSON on one line ended by a
// newline, or indented when the form, the request's "pretty" query or its
// user agent (curl, Wget, a browser) asks for it, as upstream's encoders.
func write(w http.ResponseWriter, r *http.Request, f form, contentType string, code int, obj any) {
	var body []byte
	var err error
	switch {
	case f.mediaType == applicationYAML:
		body, err = yaml.Marshal(obj)
	case f.pretty || prettyRequested(r):
		body, err = json.MarshalIndent(obj, "", "  ")
	default:
		body, err = json.Marshal(obj)
		body = append(body, '\n')
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// prettyRequested tells whether the query's "pretty" or, without one,
// the user agent asks for indented JSON.
func prettyRequested(r *http.Request) bool {
	if value := r.URL.Query().Get("pretty"); value != "" {
		pretty, _ := strconv.ParseBool(value)
		return pretty
	}
	agent := r.UserAgent()
	for _, prefix := range []string{"curl", "Wget", "Mozilla/5.0"} {
		if strings.HasPrefix(agent, prefix) {
			return true
		}
	}
	return false
}
