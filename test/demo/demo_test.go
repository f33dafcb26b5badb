package main

import (
	"os/exec"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

func demoRequests() []request {
	return requestsTo(map[string]*v1.Service{
		"web":          {Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10"}},
		"web-sticky":   {Spec: v1.ServiceSpec{ClusterIP: "10.96.0.11"}},
		"web-nodeport": {Spec: v1.ServiceSpec{Ports: []v1.ServicePort{{NodePort: 30123}}}},
	})
}

// The guest's script is valid shell, with a request line for each row
// from the namespace the row names, and its answers make the table's.
func TestGuestScriptAndAnswers(t *testing.T) {
	rs := demoRequests()
	script := guestScript("/tmp/kube-proxy.yaml", rs)
	cmd := exec.Command("sh", "-n")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sh -n: %v: %s", err, out)
	}
	for _, want := range []string{"\tanswer client tcp://10.96.0.10:80\n", "\tanswer client udp://10.96.0.10:80\n",
		"\tanswer external tcp://10.255.0.2:30123\n", "\tanswer external tcp://" + loadBalancerIP + ":80\n"} {
		if !strings.Contains(script, want) {
			t.Errorf("the script has no %q", want)
		}
	}
	if n := strings.Count(script, "\tanswer "); n != len(rs) {
		t.Errorf("%d answer lines for %d requests", n, len(rs))
	}

	lines := make([]string, len(rs))
	for i := range lines {
		lines[i] = "web-2 10.244.0.150:40000"
	}
	lines[3] = "FAILED read udp 10.244.0.150:40001: i/o timeout "
	replies, err := parseAnswers(strings.Join(lines, "\n")+"\n", len(rs))
	if err != nil {
		t.Fatal(err)
	}
	if replies[0] != (framework.Reply{Pod: "web-2", Source: "10.244.0.150:40000"}) || replies[3] != (framework.Reply{}) {
		t.Errorf("replies %+v", replies)
	}
	if _, err := parseAnswers("web-1 10.244.0.150:1\n", len(rs)); err == nil {
		t.Error("one answer for every request: no error")
	}

	var out strings.Builder
	printTable(&out, rs, replies)
	for _, want := range []string{"FROM  ", "client pod  ClusterIP web (UDP)", "FAILED       -", "10 of 11 requests answered."} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, out.String())
		}
	}
}
