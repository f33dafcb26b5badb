package tracetest

import (
	"testing"

	"github.com/rapidproxy/rapidproxy/pkg/trace"
)

// Case is a packet sent into one of a mode's golden cases, and where it
// must end.
type Case struct {
	Name string
	// Golden names the mode's golden case whose kernel objects the packet
	// goes through.
	Golden                         string
	Src, Dst, Port, Protocol, From string
	// Local says the destination is an address of the node.
	Local bool
	Want  Want
}

// Packet is the case's packet.
func (c Case) Packet(t testing.TB) trace.Packet {
	t.Helper()
	pkt, err := trace.ParsePacket(c.Src, c.Dst, c.Port, c.Protocol, c.From)
	if err != nil {
		t.Fatal(err)
	}
	pkt.LocalDestination = c.Local
	return pkt
}

// Run checks each case in a subtest of its name; tracePacket traces the
// packet through the named golden case's objects, as the mode writes them.
func Run(t *testing.T, cases []Case, tracePacket func(t *testing.T, golden string, pkt trace.Packet) trace.Result) {
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			Check(t, c.Want, tracePacket(t, c.Golden, c.Packet(t)))
		})
	}
}
