package ipvs

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// procConnectionTable is /proc/net/ip_vs_conn as Linux prints it, with an
// entry of every kind the parser must count or skip.
const procConnectionTable = `Pro FromIP   FPrt ToIP     TPrt DestIP   DPrt State       Expires PEName PEData
TCP 0AFF0104 A028 0A60650A 0050 0AF40065 1F90 ESTABLISHED    899
TCP 0AFF0104 A029 0A60650A 0050 0AF40065 1F90 TIME_WAIT      118
TCP 0AFF0104 A02A 0A60650A 0050 0AF40066 1F90 TIME_WAIT       97
TCP 0AFF0104 A02B 0A60650A 0050 0AF40066 1F90 CLOSE            7
TCP 0AFF0104 A02C 0A60650A 0050 0AF40066 1F90 FIN_WAIT       110
TCP 0AFF0104 A02D 0A60650A 0050 0AF40066 1F90 SYN_RECV        55
UDP 0AF40032 9CAB 0A60650A 0035 0AF40065 1F90 UDP            299
SCTP 0AF40032 9CAC 0A60650B 0009 0AF40065 0009 CLOSED          9
TCP fd00:0000:0000:0000:0000:0000:0000:0032 A028 fd00:0000:0000:0000:0000:0000:0000:000a 0050 fd00:0244:0000:0000:0000:0000:0000:0005 1F90 ESTABLISHED    899
TCP fd00:0000:0000:0000:0000:0000:0000:0032 A029 fd00:0000:0000:0000:0000:0000:0000:000a 0050 fd00:0244:0000:0000:0000:0000:0000:0005 1F90 TIME_WAIT      100
`

func TestConnectionTableCountsWhatHasNotEnded(t *testing.T) {
	for _, tc := range []struct {
		ipv6 bool
		want string
	}{
		// 10.244.0.102 keeps its half-closed and half-open connections
		// but not its TIME_WAIT and CLOSE ones; UDP and SCTP count.
		{false, "10.96.101.10:53/UDP 10.244.0.101:8080 1\n" +
			"10.96.101.10:80/TCP 10.244.0.101:8080 1\n" +
			"10.96.101.10:80/TCP 10.244.0.102:8080 2\n" +
			"10.96.101.11:9/SCTP 10.244.0.101:9 1\n"},
		{true, "[fd00::a]:80/TCP [fd00:244::5]:8080 1\n"},
	} {
		open, err := parseProcConnections(strings.NewReader(procConnectionTable), tc.ipv6)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for key, reals := range open {
			for real, n := range reals {
				lines = append(lines, fmt.Sprintf("%s %s %d\n", key, real, n))
			}
		}
		slices.Sort(lines)
		if got := strings.Join(lines, ""); got != tc.want {
			t.Errorf("IPv6 %t: counted\n%s, want\n%s", tc.ipv6, got, tc.want)
		}
	}
}

func TestConnectionTableErrorsNameTheLine(t *testing.T) {
	for _, bad := range []string{
		"TCP 0AFF0104 A028 0A6065 0050 0AF40065 1F90 ESTABLISHED 899\n",
		"TCP 0AFF0104 A028 0A60650A 50 0AF40065 1F90 ESTABLISHED 899\n",
		"TCP 0AFF0104 A028 0A60650A 0050 zz 1F90 ESTABLISHED 899\n",
	} {
		_, err := parseProcConnections(strings.NewReader("header\n"+bad), false)
		if err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: error %v, want one naming line 2", bad, err)
		}
	}
	if open, err := parseProcConnections(strings.NewReader("header\n"), false); err != nil || len(open) != 0 {
		t.Errorf("an empty table: %v, %v; want nothing", slices.Collect(maps.Keys(open)), err)
	}
}
