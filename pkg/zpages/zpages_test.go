package zpages

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// The answers below are upstream's (k8s.io/apiserver v0.36.3's flagz and
// statusz handlers, as kube-proxy installs them), byte for byte where the
// values are the same.
const (
	flagzJSON = `{"kind":"Flagz","apiVersion":"config.k8s.io/v1beta1","metadata":{"name":"kube-proxy"},"flags":{"config":"/etc/x.conf","v":"false"}}` + "\n"
	flagzYAML = `apiVersion: config.k8s.io/v1beta1
flags:
  config: /etc/x.conf
  v: "false"
kind: Flagz
metadata:
  name: kube-proxy
`
	flagzPrettyJSON = `{
  "kind": "Flagz",
  "apiVersion": "config.k8s.io/v1beta1",
  "metadata": {
    "name": "kube-proxy"
  },
  "flags": {
    "config": "/etc/x.conf",
    "v": "false"
  }
}`
	notAcceptableJSON = `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"only the following media types are accepted: application/json, application/yaml, text/plain","reason":"NotAcceptable","code":406}` + "\n"
	notAcceptableYAML = `apiVersion: v1
code: 406
kind: Status
message: 'only the following media types are accepted: application/json, application/yaml,
  text/plain'
metadata: {}
reason: NotAcceptable
status: Failure
`
	notAcceptableIndented = `{
  "kind": "Status",
  "apiVersion": "v1",
  "metadata": {},
  "status": "Failure",
  "message": "only the following media types are accepted: application/json, application/yaml, text/plain",
  "reason": "NotAcceptable",
  "code": 406
}`
)

const (
	beta1 = "application/json;v=v1beta1;g=config.k8s.io;as=Flagz"
	text  = "text/plain; charset=utf-8"
)

func get(h http.HandlerFunc, accept, agent, query string) *http.Response {
	r := httptest.NewRequest(http.MethodGet, "/flagz"+query, nil)
	if accept != "" {
		r.Header.Set("Accept", accept)
	}
	r.Header.Set("User-Agent", agent)
	rec := httptest.NewRecorder()
	h(rec, r)
	return rec.Result()
}

func TestFlagzAnswersEachAcceptHeaderAsUpstream(t *testing.T) {
	pages := New(map[string]string{"config": "/etc/x.conf", "v": "false"})
	for _, tc := range []struct {
		accept, agent, query string
		code                 int
		contentType, body    string
		deprecated           bool
	}{
		{accept: "", code: 200, contentType: text},
		{accept: " ", code: 200, contentType: text},
		{accept: "*/*", code: 200, contentType: text},
		{accept: "text/*", code: 200, contentType: text},
		{accept: "application/xml, text/plain;q=0.5", code: 200, contentType: text},
		{accept: "application/json, text/plain", code: 200, contentType: text},
		{accept: "text/html, */*;q=0.1", code: 200, contentType: text},
		{accept: "text/plain, " + beta1, code: 200, contentType: text},
		{accept: beta1, code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzJSON},
		{accept: beta1 + ";foo=bar", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzJSON},
		{accept: beta1 + ";q=0", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzJSON},
		{accept: "text/plain;q=0.1, " + beta1, code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzJSON},
		{accept: "application/*;v=v1beta1;g=config.k8s.io;as=Flagz", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzJSON},
		{accept: "*/*;v=v1beta1;g=config.k8s.io;as=Flagz", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzJSON},
		{accept: beta1, agent: "curl/8.5.0", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzPrettyJSON},
		{accept: beta1, query: "?pretty=1", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzPrettyJSON},
		{accept: beta1 + ";pretty=1", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzPrettyJSON},
		{accept: beta1, agent: "curl/8.5.0", query: "?pretty=false", code: 200, contentType: "application/json;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzJSON},
		{accept: "application/yaml;v=v1beta1;g=config.k8s.io;as=Flagz", code: 200, contentType: "application/yaml;g=config.k8s.io;v=v1beta1;as=Flagz", body: flagzYAML},
		{accept: "application/json;v=v1alpha1;g=config.k8s.io;as=Flagz", code: 200, contentType: "application/json;g=config.k8s.io;v=v1alpha1;as=Flagz",
			body: strings.Replace(flagzJSON, "v1beta1", "v1alpha1", 1), deprecated: true},
		// A Status in the form the header takes without a kind.
		{accept: "application/json", code: 406, contentType: "application/json", body: notAcceptableJSON},
		{accept: "application/json;V=v1beta1;G=config.k8s.io;AS=Flagz", code: 406, contentType: "application/json", body: notAcceptableJSON},
		{accept: "application/json;stream=watch", code: 406, contentType: "application/json", body: notAcceptableJSON},
		{accept: "application/yaml", code: 406, contentType: "application/yaml", body: notAcceptableYAML},
		{accept: "application/json;pretty=1", code: 406, contentType: "application/json", body: notAcceptableIndented},
		// Else indented JSON.
		{accept: "text/html", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "garbage", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: ";;;", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "APPLICATION/JSON;v=v1beta1;g=config.k8s.io;as=Flagz", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "application/cbor;v=v1beta1;g=config.k8s.io;as=Flagz", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "application/vnd.kubernetes.protobuf;v=v1beta1;g=config.k8s.io;as=Flagz", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "application/json;v=v1;g=config.k8s.io;as=Flagz", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "application/json;v=v1beta1;g=config.k8s.io;as=Statusz", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "application/json;v=v1beta1;g=config.k8s.io", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: "text/plain;v=v1beta1;g=config.k8s.io;as=Flagz", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: beta1 + ";stream=watch", code: 406, contentType: "application/json", body: notAcceptableIndented},
		{accept: beta1 + ";sv=v1", code: 406, contentType: "application/json", body: notAcceptableIndented},
	} {
		resp := get(pages.Flagz, tc.accept, tc.agent, tc.query)
		var body bytes.Buffer
		_, _ = body.ReadFrom(resp.Body)
		name := tc.accept + " " + tc.agent + tc.query
		if resp.StatusCode != tc.code || resp.Header.Get("Content-Type") != tc.contentType {
			t.Errorf("%s: %d %s, want %d %s", name, resp.StatusCode, resp.Header.Get("Content-Type"), tc.code, tc.contentType)
		}
		switch {
		case tc.contentType == text:
			if !strings.HasPrefix(body.String(), "\nkube-proxy flagz\nWarning: ") || !strings.Contains(body.String(), "/etc/x.conf") {
				t.Errorf("%s: %q, want the text form", name, body.String())
			}
		case body.String() != tc.body:
			t.Errorf("%s:\n%s\nwant\n%s", name, body.String(), tc.body)
		}
		warning := resp.Header.Get("Warning")
		if tc.deprecated != (warning == `299 - "This version of the flagz endpoint is deprecated. Please use a newer version."`) {
			t.Errorf("%s: Warning %q, deprecated version %v", name, warning, tc.deprecated)
		}
	}
}

func TestStatuszServesItsFieldsInEachVersion(t *testing.T) {
	pages := New(nil)
	pages.started = time.Now().Add(-90 * time.Minute)
	for _, version := range []string{"v1alpha1", "v1beta1"} {
		resp := get(pages.Statusz, "application/json;v="+version+";g=config.k8s.io;as=Statusz", "", "")
		if want := "application/json;g=config.k8s.io;v=" + version + ";as=Statusz"; resp.StatusCode != 200 || resp.Header.Get("Content-Type") != want {
			t.Fatalf("%s: %d %s, want 200 %s", version, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
		var got map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		for key, want := range map[string]any{
			"kind": "Statusz", "apiVersion": "config.k8s.io/" + version, "metadata": map[string]any{"name": "kube-proxy"},
			"startTime": pages.started.UTC().Format(time.RFC3339), "uptimeSeconds": float64(5400),
			"emulationVersion": "1.37", "paths": []any{"/configz", "/flagz", "/healthz", "/metrics", "/proxyMode"},
		} {
			if g, _ := json.Marshal(got[key]); string(g) != mustJSON(want) {
				t.Errorf("%s: %s is %s, want %s", version, key, g, mustJSON(want))
			}
		}
		for _, key := range []string{"goVersion", "binaryVersion"} {
			if s, _ := got[key].(string); s == "" {
				t.Errorf("%s: no %s in %v", version, key, got)
			}
		}
		if len(got) != 9 {
			t.Errorf("%s: %d fields, want upstream's 9: %v", version, len(got), got)
		}
	}
	resp := get(pages.Statusz, "", "", "")
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	if !strings.Contains(body.String(), " 1 hr 30 min 00 sec\n") {
		t.Errorf("the text form:\n%s", body.String())
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
