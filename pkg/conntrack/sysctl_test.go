package conntrack

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kpconfig "k8s.io/kube-proxy/config/v1alpha1"
	"k8s.io/utils/ptr"

	"github.com/rapidproxy/rapidproxy/internal/sysctl"
)

func TestDesiredMax(t *testing.T) {
	cases := []struct {
		perCore, min int32
		cpus, want   int
	}{
		{32768, 131072, 2, 131072},
		{32768, 131072, 8, 262144},
		{0, 131072, 8, 0}, // 0 per core: leave the limit as is
		{100, 0, 4, 400},
	}
	for _, c := range cases {
		cfg := kpconfig.KubeProxyConntrackConfiguration{MaxPerCore: ptr.To(c.perCore), Min: ptr.To(c.min)}
		if got := desiredMax(cfg, c.cpus); got != c.want {
			t.Errorf("perCore %d min %d cpus %d: got %d, want %d", c.perCore, c.min, c.cpus, got, c.want)
		}
	}
}

func defaults() kpconfig.KubeProxyConntrackConfiguration {
	return kpconfig.KubeProxyConntrackConfiguration{
		MaxPerCore:            ptr.To[int32](0),
		TCPEstablishedTimeout: &metav1.Duration{Duration: 24 * time.Hour},
		TCPCloseWaitTimeout:   &metav1.Duration{Duration: time.Hour},
	}
}

func TestSetSysctls(t *testing.T) {
	fake := &sysctl.Fake{Values: map[string]int{maxName: 1000, hashsizeName: 100, establishedTO: 432000, closeWaitTO: 60, udpTO: 30, udpStreamTO: 120, beLiberal: 0}}
	cfg := defaults()
	cfg.MaxPerCore, cfg.Min = ptr.To[int32](0), ptr.To[int32](0)
	cfg.UDPTimeout = metav1.Duration{Duration: 0} // 0: leave as is
	cfg.TCPBeLiberal = true
	if err := SetSysctls(fake, cfg); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{maxName: 1000, hashsizeName: 100, establishedTO: 86400, closeWaitTO: 3600, udpTO: 30, udpStreamTO: 120, beLiberal: 1}
	for k, v := range want {
		if fake.Values[k] != v {
			t.Errorf("%s = %d, want %d", k, fake.Values[k], v)
		}
	}
}

func TestConntrackMaxRaisedNeverLowered(t *testing.T) {
	fake := &sysctl.Fake{Values: map[string]int{maxName: 1000, hashsizeName: 100}}
	if err := raiseMax(fake, 262144); err != nil {
		t.Fatal(err)
	}
	if fake.Values[maxName] != 262144 || fake.Values[hashsizeName] != 65536 {
		t.Errorf("got max %d hash %d", fake.Values[maxName], fake.Values[hashsizeName])
	}
	if err := raiseMax(fake, 1000); err != nil || fake.Values[maxName] != 262144 {
		t.Errorf("lowered: %d, %v", fake.Values[maxName], err)
	}
}

// In a non-initial network namespace nf_conntrack_max is read-only: fine
// when it is already large enough, an error naming it when not.
func TestReadOnlyConntrackMax(t *testing.T) {
	fits := &sysctl.Fake{Values: map[string]int{maxName: 262144}, ReadOnly: map[string]bool{maxName: true}}
	if err := raiseMax(fits, 131072); err != nil {
		t.Errorf("value already fits, yet: %v", err)
	}
	small := &sysctl.Fake{Values: map[string]int{maxName: 65536}, ReadOnly: map[string]bool{maxName: true}}
	if err := raiseMax(small, 131072); err == nil || !strings.Contains(err.Error(), maxName) {
		t.Errorf("want an error naming %s, got %v", maxName, err)
	}
}

// The hash table is raised to a quarter of the limit even when the limit
// itself is already high enough.
func TestConntrackHashsizeCheckedWhenTheLimitFits(t *testing.T) {
	fake := &sysctl.Fake{Values: map[string]int{maxName: 262144, hashsizeName: 1024}}
	if err := raiseMax(fake, 131072); err != nil {
		t.Fatal(err)
	}
	if fake.Values[maxName] != 262144 || fake.Values[hashsizeName] != 32768 {
		t.Errorf("got max %d hash %d, want 262144 and 32768", fake.Values[maxName], fake.Values[hashsizeName])
	}
}

// The limit is sized by the host's online CPUs, as the kernel lists them.
func TestCountCPUList(t *testing.T) {
	for list, want := range map[string]int{"0": 1, "0-3": 4, "0-3,8-11": 8, "0,2,4-5": 4} {
		if got, err := countCPUList(list); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", list, got, err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "0-"} {
		if _, err := countCPUList(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if hostCPUs() < 1 {
		t.Error("no CPU on this host")
	}
}
