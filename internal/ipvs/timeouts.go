package ipvs

import (
	"fmt"
	"time"

	libipvs "github.com/moby/ipvs"
)

// SetTimeouts sets IPVS's connection timeouts, as `ipvsadm --set` does;
// a zero leaves that timeout as the kernel has it.
func SetTimeouts(tcp, tcpFin, udp time.Duration) error {
	if tcp == 0 && tcpFin == 0 && udp == 0 {
		return nil
	}
	h, err := libipvs.New("")
	if err != nil {
		return fmt.Errorf("opening IPVS: %w", err)
	}
	defer h.Close()
	if err := h.SetConfig(&libipvs.Config{TimeoutTCP: tcp, TimeoutTCPFin: tcpFin, TimeoutUDP: udp}); err != nil {
		return fmt.Errorf("setting IPVS timeouts (tcp %s, tcpfin %s, udp %s): %w", tcp, tcpFin, udp, err)
	}
	return nil
}
