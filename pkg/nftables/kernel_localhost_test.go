package nftables

import (
	"context"
	"errors"
	"io"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/rapidproxy/rapidproxy/pkg/localnodeport"
)

// On the real kernel, with the gate KubeProxyNFTablesLocalhostNodePorts
// on: without loopback in nodePortAddresses, every localhost NodePort is
// rejected and counted; with it, TCP NodePorts reach their endpoint
// through the userspace proxy (told the NodePorts after each sync) and
// UDP ones are rejected and counted. Everything stays in the test's own
// network namespace: the endpoint is an address on its loopback device.
func TestKernelLocalhostNodePorts(t *testing.T) {
	if !inNetns(t) {
		return
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if out, err := exec.Command("ip", "addr", "add", "10.244.1.5/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// The endpoint of ns/np's TCP port (8080): it says "pong" and closes.
	ln, err := net.Listen("tcp", "10.244.1.5:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "pong\n")
			c.Close()
		}
	}()

	t.Run("reject", func(t *testing.T) {
		params := v4(func(p *Params) { p.LocalhostNodePorts = LocalhostNodePortsReject })(t)
		h, k := kernelHarness(t, v1.IPv4Protocol, params)
		h.apply(nodePortObjects()...)
		h.full()
		if err := dialTCP(30020); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("TCP to 127.0.0.1:30020: %v, want it refused", err)
		}
		if err := sendUDP(30053); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP to 127.0.0.1:30053: %v, want it refused", err)
		}
		counts := rejected(t, k)
		if counts["TCP"] == 0 || counts["UDP"] == 0 {
			t.Errorf("rejected packets counted %v, want TCP and UDP ones", counts)
		}
	})

	t.Run("proxy", func(t *testing.T) {
		params := v4(func(p *Params) { p.LocalhostNodePorts = LocalhostNodePortsProxy })(t)
		h, k := kernelHarness(t, v1.IPv4Protocol, params)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		proxy := localnodeport.New(ctx, v1.IPv4Protocol)
		defer proxy.Shutdown()
		h.syncer.cfg.LocalhostProxy = proxy
		h.apply(nodePortObjects()...)
		h.full()
		c, err := net.DialTimeout("tcp", "127.0.0.1:30020", time.Second)
		if err != nil {
			t.Fatalf("TCP to 127.0.0.1:30020: %v", err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(c)
		c.Close()
		if err != nil || string(got) != "pong\n" {
			t.Errorf("TCP to 127.0.0.1:30020 read %q, %v: want the endpoint's pong", got, err)
		}
		if err := sendUDP(30053); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP to 127.0.0.1:30053: %v, want it refused", err)
		}
		counts := rejected(t, k)
		if counts["UDP"] == 0 {
			t.Errorf("rejected packets counted %v, want UDP ones", counts)
		}
		if _, ok := counts["TCP"]; ok {
			t.Errorf("a TCP counter %v with the proxy serving TCP", counts)
		}
		// The service goes: its listener with it, after the sync.
		h.tracker.OnService(types.NamespacedName{Namespace: "ns", Name: "np"}, nil)
		h.changed = h.tracker.Apply(h.state).ServicePorts
		h.partial()
		if proxy.Serving(v1.ProtocolTCP, 30020) {
			t.Error("still serving a NodePort whose service is gone")
		}
	})
}

// On the real kernel: a restart with another localhost NodePort setting
// (the gate turned off, or loopback put into nodePortAddresses) leaves the
// table as a fresh sync with that setting writes it, the rejection chains
// and counters it does not use removed, as upstream removes them.
func TestKernelLocalhostNodePortsSettingChanges(t *testing.T) {
	if !inNetns(t) {
		return
	}
	settings := []LocalhostNodePorts{LocalhostNodePortsReject, LocalhostNodePortsProxy, LocalhostNodePortsOff, LocalhostNodePortsProxy, LocalhostNodePortsReject}
	params := func(l LocalhostNodePorts) Params {
		return v4(func(p *Params) { p.LocalhostNodePorts = l })(t)
	}
	h, k := kernelHarness(t, v1.IPv4Protocol, params(settings[0]))
	h.apply(localhostNodePortObjects()...)
	h.full()
	for _, l := range settings[1:] {
		h.syncer = h.kernelSyncer(v1.IPv4Protocol, params(l), k)
		h.full()
		// The flushed chains go a moment later.
		time.Sleep(staleChainDelay + 100*time.Millisecond)
		h.changed = nil
		h.partial()
		compareWithFresh(t, h, params(l))
	}
}

func dialTCP(port int) error {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
	if err == nil {
		c.Close()
	}
	return err
}

// sendUDP sends a datagram on a connected socket and waits for the ICMP
// error a reject sends back (ECONNREFUSED on the next read).
func sendUDP(port int) error {
	c, err := net.Dial("udp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err = c.Read(make([]byte, 16))
	return err
}

// rejected are the packets each protocol's named counter counted.
func rejected(t *testing.T, k *kernelNFT) map[string]uint64 {
	t.Helper()
	counters, err := k.ListCounters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, c := range counters {
		for _, proto := range LocalhostNodePortProtocols {
			if c.Name == LocalhostRejectedCounter(proto) && c.Packets != nil {
				out[string(proto)] = *c.Packets
			}
		}
	}
	return out
}
