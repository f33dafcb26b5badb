package iptables

import (
	"errors"

	"golang.org/x/sys/unix"

	"github.com/rapidproxy/rapidproxy/internal/nfacct"
	"github.com/rapidproxy/rapidproxy/pkg/metrics"
)

// nfacctObjects are the nfacct objects the rules count packets in (see
// Params.NFAcct); both IP families share them.
var nfacctObjects = []string{metrics.NFAcctCTStateInvalidDropped, metrics.NFAcctLocalhostNodePortsAccepted}

// EnsureNFAcctObjects creates the nfacct objects the rules count packets
// in, keeping the counts of those there already (upstream's, or an earlier
// run's). An error means the rules must do without them, as upstream's do
// when the kernel lacks nfnetlink_acct.
func EnsureNFAcctObjects() error {
	for _, name := range nfacctObjects {
		if err := nfacct.Ensure(name); err != nil {
			return err
		}
	}
	return nil
}

// CleanupNFAcctObjects deletes the nfacct objects, which the kernel allows
// only once no rule uses them: after every backend's and family's rules
// are gone. It returns the names of those it deleted; a kernel without
// nfnetlink_acct has none to delete.
func CleanupNFAcctObjects() ([]string, error) {
	var removed []string
	var errs []error
	for _, name := range nfacctObjects {
		switch err := nfacct.Delete(name); {
		case err == nil:
			removed = append(removed, name)
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.EINVAL):
		default:
			errs = append(errs, err)
		}
	}
	return removed, errors.Join(errs...)
}
