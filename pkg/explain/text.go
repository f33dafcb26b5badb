package explain

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/textfill"
	"github.com/rapidproxy/rapidproxy/pkg/proxy"
	"github.com/rapidproxy/rapidproxy/pkg/state"
)

// width is the terminal width the text is laid out for; only names longer
// than anyone uses make a line longer.
const width = textfill.Width

// WriteServicePorts writes the service ports as a table, one per line.
func WriteServicePorts(w io.Writer, ports []proxy.ServicePortSummary) {
	if len(ports) == 0 {
		fmt.Fprintln(w, "This node programs no service port.")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE PORT\tADDRESS\tNODEPORT\tENDPOINTS\tCLUSTER\tLOCAL")
	for _, p := range ports {
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%d\t%s\t%s\n", p.Name, hostPort(p.ClusterIP, p.Port), p.Protocol,
			orDash(p.NodePort), p.Endpoints, count(p.ClusterEndpoints), count(p.LocalEndpoints))
	}
	_ = tw.Flush()
}

// WriteExplanation writes one service's explanation: each service port's
// settings, its paths, its endpoints with the reasons for those a path
// leaves out, and its kernel objects.
func WriteExplanation(w io.Writer, e proxy.Explanation) {
	node := e.Node
	if e.Zone != "" {
		node += " (zone " + e.Zone + ")"
	}
	fmt.Fprintf(w, "Service %s on node %s\n", e.Service, node)
	for _, sp := range e.ServicePorts {
		fmt.Fprintln(w)
		writeServicePort(w, sp)
	}
}

// labelWidth lines up the values of a service port's settings.
const labelWidth = 15

func writeServicePort(w io.Writer, sp proxy.ServicePortExplanation) {
	fmt.Fprintf(w, "%s (%s, %s)\n", sp.Name, sp.Protocol, sp.Family)
	indent := strings.Repeat(" ", 2+labelWidth)
	field := func(label, value string) {
		if value != "" {
			io.WriteString(w, wrap(value, fmt.Sprintf("  %-*s", labelWidth, label), indent))
		}
	}
	field("cluster IP", hostPort(sp.ClusterIP, sp.Port))
	if sp.NodePort != 0 {
		field("node port", strconv.Itoa(int(sp.NodePort)))
	}
	field("external IPs", strings.Join(sp.ExternalIPs, " "))
	field("load balancer", strings.Join(sp.LoadBalancerIPs, " "))
	field("source ranges", strings.Join(sp.LoadBalancerSourceRanges, " "))
	field("skipped", skipped(sp.Skipped))
	field("policies", policies(sp))
	if sp.AffinityTimeoutSeconds > 0 {
		field("affinity", fmt.Sprintf("%s, %d s", sp.SessionAffinity, sp.AffinityTimeoutSeconds))
	}
	field("distribution", sp.TrafficDistribution)
	field("last changed", timeText(sp.LastChanged, "never"))
	if sp.LastChanged != nil {
		field("last synced", timeText(sp.LastSynced, "not since the last change: the syncs since failed"))
	}
	fmt.Fprintln(w)
	field("cluster path", path(sp.Cluster))
	field("local path", path(sp.Local))
	fmt.Fprintln(w)
	writeEndpoints(w, sp)
	if sp.Kernel != nil {
		fmt.Fprintln(w)
		writeKernel(w, sp.Kernel)
	}
}

// writeEndpoints writes the endpoints as a table, a path's verdict on
// each in a column of its own, and the reasons as numbered notes below.
func writeEndpoints(w io.Writer, sp proxy.ServicePortExplanation) {
	if len(sp.Endpoints) == 0 {
		fmt.Fprintln(w, "  no endpoints")
		return
	}
	var notes []string
	verdict := func(u *state.Use) string {
		if u.Used {
			return "used"
		}
		n := 0
		for n < len(notes) && notes[n] != u.Message {
			n++
		}
		if n == len(notes) {
			notes = append(notes, u.Message)
		}
		return fmt.Sprintf("no [%d]", n+1)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "  ENDPOINT\tNODE\tZONE\tCONDITIONS"
	if sp.Cluster != nil {
		header += "\tCLUSTER"
	}
	if sp.Local != nil {
		header += "\tLOCAL"
	}
	fmt.Fprintln(tw, header)
	for _, ep := range sp.Endpoints {
		row := fmt.Sprintf("  %s\t%s\t%s\t%s", ep.Address, orDash(ep.Node), orDash(ep.Zone), conditions(ep))
		if ep.Cluster != nil {
			row += "\t" + verdict(ep.Cluster)
		}
		if ep.Local != nil {
			row += "\t" + verdict(ep.Local)
		}
		fmt.Fprintln(tw, row)
	}
	_ = tw.Flush()
	for i, note := range notes {
		lead := fmt.Sprintf("  [%d] ", i+1)
		io.WriteString(w, wrap(note, lead, strings.Repeat(" ", len(lead))))
	}
}

func writeKernel(w io.Writer, k *proxy.KernelExplanation) {
	fmt.Fprintf(w, "  kernel objects (%s)\n", k.Mode)
	kindWidth := 0
	for _, o := range k.Objects {
		kindWidth = max(kindWidth, len(o.Kind))
	}
	indent := strings.Repeat(" ", 4+kindWidth+2)
	for _, o := range k.Objects {
		text := o.Name
		if o.Summary != "" {
			text += ": " + o.Summary
		}
		io.WriteString(w, wrap(text, fmt.Sprintf("    %-*s  ", kindWidth, o.Kind), indent))
	}
	v := k.Verify
	if v == nil {
		return
	}
	if v.Error != "" {
		io.WriteString(w, wrap("could not read the kernel: "+v.Error, "  verify: ", "    "))
	}
	switch n := len(v.Differences); {
	case n == 0 && v.Error == "":
		fmt.Fprintln(w, "  verify: the kernel holds what this node wants")
	case n == 1:
		fmt.Fprintln(w, "  verify: 1 difference from what this node wants")
	case n > 1:
		fmt.Fprintf(w, "  verify: %d differences from what this node wants\n", n)
	}
	for _, d := range v.Differences {
		io.WriteString(w, wrap(d, "    - ", "      "))
	}
}

func policies(sp proxy.ServicePortExplanation) string {
	s := "internal " + sp.InternalTrafficPolicy
	if sp.ExternalTrafficPolicy != "" {
		s += ", external " + sp.ExternalTrafficPolicy
	}
	if sp.HealthCheckNodePort != 0 {
		s += fmt.Sprintf(" (health check node port %d)", sp.HealthCheckNodePort)
	}
	return s
}

func path(p *proxy.PathExplanation) string {
	if p == nil {
		return ""
	}
	s := fmt.Sprintf("%s: %d endpoints", p.Serves, p.Endpoints)
	if p.Endpoints == 1 {
		s = strings.TrimSuffix(s, "s")
	}
	if p.Note != "" {
		s += "; " + p.Note
	}
	return s
}

func skipped(addrs []state.SkippedAddress) string {
	var parts []string
	for _, a := range addrs {
		parts = append(parts, a.Address+" ("+a.Reason+")")
	}
	return strings.Join(parts, ", ")
}

func conditions(ep proxy.EndpointExplanation) string {
	switch {
	case ep.Ready:
		return "ready"
	case ep.Terminating && ep.Serving:
		return "serving, terminating"
	case ep.Terminating:
		return "terminating"
	}
	return "not ready"
}

func timeText(t *time.Time, none string) string {
	if t == nil {
		return none
	}
	return t.UTC().Format(time.RFC3339)
}

func hostPort(ip string, port int32) string {
	return net.JoinHostPort(ip, strconv.Itoa(int(port)))
}

func orDash[T comparable](v T) string {
	var zero T
	if v == zero {
		return "-"
	}
	return fmt.Sprint(v)
}

func count(n *int) string {
	if n == nil {
		return "-"
	}
	return strconv.Itoa(*n)
}

// wrap fills text into lines for the terminal (see textfill).
func wrap(text, first, rest string) string { return textfill.Fill(text, first, rest) }
