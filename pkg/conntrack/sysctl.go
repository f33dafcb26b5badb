// Package conntrack sets the kernel's connection-tracking limits and
// timeouts from the configuration, and deletes flows that would keep UDP
// clients talking to an endpoint that is gone.
package conntrack

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"

	"github.com/rapidproxy/rapidproxy/internal/sysctl"
)

const (
	maxName       = "net/netfilter/nf_conntrack_max"
	hashsizeName  = "/sys/module/nf_conntrack/parameters/hashsize"
	establishedTO = "net/netfilter/nf_conntrack_tcp_timeout_established"
	closeWaitTO   = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	udpTO         = "net/netfilter/nf_conntrack_udp_timeout"
	udpStreamTO   = "net/netfilter/nf_conntrack_udp_timeout_stream"
	beLiberal     = "net/netfilter/nf_conntrack_tcp_be_liberal"
)

// SetSysctls applies the conntrack settings: the table size, raised to
// max(maxPerCore x CPUs, min) and never lowered, with the hash table at a
// quarter of it; the timeouts that are not 0 ("leave as is"); and liberal
// TCP tracking when asked.
func SetSysctls(s sysctl.Interface, cfg kpconfig.KubeProxyConntrackConfiguration) error {
	if max := desiredMax(cfg, hostCPUs()); max > 0 {
		if err := raiseMax(s, max); err != nil {
			return err
		}
	}
	timeouts := []struct {
		name string
		d    time.Duration
	}{
		{establishedTO, durationOf(cfg.TCPEstablishedTimeout)},
		{closeWaitTO, durationOf(cfg.TCPCloseWaitTimeout)},
		{udpTO, cfg.UDPTimeout.Duration},
		{udpStreamTO, cfg.UDPStreamTimeout.Duration},
	}
	for _, t := range timeouts {
		if t.d <= 0 {
			continue
		}
		if err := setIfDifferent(s, t.name, int(t.d/time.Second)); err != nil {
			return err
		}
	}
	if cfg.TCPBeLiberal {
		return setIfDifferent(s, beLiberal, 1)
	}
	return nil
}

func durationOf(d *metav1.Duration) time.Duration {
	if d == nil {
		return 0
	}
	return d.Duration
}

// desiredMax is max(maxPerCore x cpus, min); 0 means leave the limit alone.
func desiredMax(cfg kpconfig.KubeProxyConntrackConfiguration, cpus int) int {
	perCore, minimum := 0, 0
	if cfg.MaxPerCore != nil {
		perCore = int(*cfg.MaxPerCore)
	}
	if cfg.Min != nil {
		minimum = int(*cfg.Min)
	}
	if perCore == 0 {
		return 0
	}
	return max(perCore*cpus, minimum)
}

// raiseMax raises nf_conntrack_max (and the hash size) to at least max. In
// a network namespace other than the host's the limit is read-only; that
// is only an error when the current value is too small.
func raiseMax(s sysctl.Interface, max int) error {
	// The hash table is checked even when the limit is already high
	// enough: another program may have raised one and not the other.
	if hash, err := s.Get(hashsizeName); err == nil && hash < max/4 {
		klog.InfoS("Setting conntrack hashsize", "conntrackHashsize", max/4)
		if err := s.Set(hashsizeName, max/4); err != nil {
			klog.InfoS("Could not raise the conntrack hash size", "want", max/4, "err", err)
		}
	}
	current, err := s.Get(maxName)
	if err == nil && current >= max {
		return nil
	}
	if err := s.Set(maxName, max); err != nil {
		return fmt.Errorf("raising %s from %d to %d: %w", maxName, current, max, err)
	}
	klog.InfoS("Set sysctl", "entry", maxName, "value", max)
	return nil
}

// onlineCPUsFile lists the host's online CPUs, whatever CPUs this
// process may run on: the table serves the whole host.
const onlineCPUsFile = "/sys/devices/system/cpu/online"

// hostCPUs counts the host's online CPUs, or, if that cannot be read, the
// CPUs this process may use.
func hostCPUs() int {
	if data, err := os.ReadFile(onlineCPUsFile); err == nil {
		if n, err := countCPUList(strings.TrimSpace(string(data))); err == nil && n > 0 {
			return n
		}
	}
	return runtime.NumCPU()
}

// countCPUList counts the CPUs of a kernel CPU list such as "0-3,8,10-11".
func countCPUList(list string) (int, error) {
	n := 0
	for _, part := range strings.Split(list, ",") {
		first, last, isRange := strings.Cut(part, "-")
		lo, err := strconv.Atoi(first)
		if err != nil {
			return 0, fmt.Errorf("CPU list %q: %w", list, err)
		}
		hi := lo
		if isRange {
			if hi, err = strconv.Atoi(last); err != nil || hi < lo {
				return 0, fmt.Errorf("CPU list %q: bad range %q", list, part)
			}
		}
		n += hi - lo + 1
	}
	return n, nil
}

func setIfDifferent(s sysctl.Interface, name string, value int) error {
	if current, err := s.Get(name); err == nil && current == value {
		return nil
	}
	if err := s.Set(name, value); err != nil {
		return fmt.Errorf("setting %s to %d: %w", name, value, err)
	}
	return nil
}
