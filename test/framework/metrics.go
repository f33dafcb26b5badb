package framework

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// MetricsURL is where a kube-proxy started with metricsBindAddress
// 0.0.0.0:10249 serves /metrics, as seen from the host.
const MetricsURL = "http://" + NodeIPv4 + ":10249"

// Sample is one series of a Prometheus text exposition.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Metrics is one scrape.
type Metrics []Sample

// FetchMetrics scrapes url (e.g. MetricsURL + "/metrics").
func FetchMetrics(url string) (Metrics, error) {
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return ParseMetrics(string(body))
}

// Get returns the value of the first series named name whose labels
// include every "key=value" in labels.
func (m Metrics) Get(name string, labels ...string) (float64, bool) {
next:
	for _, s := range m {
		if s.Name != name {
			continue
		}
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			if s.Labels[k] != v {
				continue next
			}
		}
		return s.Value, true
	}
	return 0, false
}

// ParseMetrics reads the Prometheus text format: `name{k="v",...} value`
// lines; comments and timestamps are ignored.
func ParseMetrics(text string) (Metrics, error) {
	var out Metrics
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		s, err := parseSample(line)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out = append(out, s)
	}
	return out, nil
}

func parseSample(line string) (Sample, error) {
	s := Sample{Labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
		s.Name = line[:i]
		var err error
		if rest, err = parseLabels(line[i+1:], s.Labels); err != nil {
			return s, err
		}
	} else {
		s.Name, rest, _ = strings.Cut(line, " ")
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, fmt.Errorf("no value")
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	s.Value = v
	return s, err
}

// parseLabels reads `k="v",...}` into labels and returns what follows.
func parseLabels(in string, labels map[string]string) (string, error) {
	for {
		in = strings.TrimLeft(in, ", ")
		if strings.HasPrefix(in, "}") {
			return in[1:], nil
		}
		key, rest, ok := strings.Cut(in, `="`)
		if !ok {
			return "", fmt.Errorf("bad labels")
		}
		var value strings.Builder
		i := 0
		for ; i < len(rest) && rest[i] != '"'; i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				if rest[i] == 'n' {
					value.WriteByte('\n')
					continue
				}
			}
			value.WriteByte(rest[i])
		}
		if i == len(rest) {
			return "", fmt.Errorf("unterminated label value")
		}
		labels[key] = value.String()
		in = rest[i+1:]
	}
}
