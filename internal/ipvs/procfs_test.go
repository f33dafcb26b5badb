package ipvs

import (
	"fmt"
	"strings"
	"testing"
)

// procListing is /proc/net/ip_vs as Linux 6.12 prints it, with a virtual
// server of every kind the parser must read or skip.
const procListing = `IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A600001:0050 rr 
  -> 0AF40006:1F90      Masq    0      3          1         
  -> 0AF40005:1F90      Masq    1      0          0         
UDP  0A60000A:0035 rr persistent 10800 FFFFFFFF
  -> 0AF40014:0035      Masq    1      0          2         
SCTP  0A600003:0009 mh 
TCP  [fd00:0000:0000:0000:0000:0000:0000:0001]:0050 rr 
  -> [fd00:0244:0000:0000:0000:0000:0000:0005]:1F90      Masq    1      0          0         
FWM  00000001 rr 
  -> 0AF40007:0050      Masq    1      0          0         
AH  0A600004:0000 rr 
  -> 0AF40008:0000      Masq    1      0          0         
`

func TestProcListingIsRead(t *testing.T) {
	for _, tc := range []struct {
		ipv6 bool
		want string
	}{
		{false, "10.96.0.1:80/TCP: [{10.244.0.6 8080 0 3 1} {10.244.0.5 8080 1 0 0}]\n" +
			"10.96.0.10:53/UDP: [{10.244.0.20 53 1 0 2}]\n" +
			"10.96.0.3:9/SCTP: []\n"},
		{true, "[fd00::1]:80/TCP: [{fd00:244::5 8080 1 0 0}]\n"},
	} {
		var got strings.Builder
		err := parseProcIPVS(strings.NewReader(procListing), tc.ipv6, func(key VirtualServerKey, reals []RealServer) error {
			fmt.Fprintf(&got, "%s: %v\n", key, reals)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if got.String() != tc.want {
			t.Errorf("IPv6 %t: read\n%s, want\n%s", tc.ipv6, got.String(), tc.want)
		}
	}
}

func TestProcListingErrorsNameTheLine(t *testing.T) {
	for _, bad := range []string{
		"TCP  0A6000:0050 rr\n",
		"TCP  0A600001:0050 rr\n  -> 0AF40005:1F90 Masq one 0 0\n",
		"TCP  0A600001:0050 rr\n  -> 0AF40005:1F90 Masq\n",
		"UDP  [fd00::zz]:0035 rr\n",
	} {
		err := parseProcIPVS(strings.NewReader("h\nh\nh\n"+bad), false, func(VirtualServerKey, []RealServer) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: error %v, want one naming the line", bad, err)
		}
	}
}

// BenchmarkProcListing reads a listing of 10,000 virtual servers with 5
// real servers each, a restart's read at 10k services.
func BenchmarkProcListing(b *testing.B) {
	var sb strings.Builder
	sb.WriteString("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\n")
	for i := range 10000 {
		fmt.Fprintf(&sb, "TCP  0A60%04X:0050 rr \n", i)
		for j := range 5 {
			fmt.Fprintf(&sb, "  -> 0AF4%02X%02X:1F90      Masq    1      0          0         \n", j, i%250)
		}
	}
	listing := sb.String()
	b.ReportAllocs()
	for b.Loop() {
		servers := 0
		err := parseProcIPVS(strings.NewReader(listing), false, func(VirtualServerKey, []RealServer) error {
			servers++
			return nil
		})
		if err != nil || servers != 10000 {
			b.Fatal(servers, err)
		}
	}
}
