package ipvs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
)

// What taking the IPVS mode off a node needs besides one family's
// Interface: whether IPVS is there at all, the link both families share,
// and the ipsets of either family.

// Loaded tells whether the ip_vs module is loaded or built in. Without it
// the node holds no IPVS state, and opening IPVS would load the module.
func Loaded() bool {
	_, err := os.Stat("/sys/module/ip_vs")
	return err == nil
}

// DeleteDummyLink deletes kube-ipvs0 with every address on it; false when
// there was none.
func DeleteDummyLink() (bool, error) {
	link, err := netlink.LinkByName(DummyLink)
	if err != nil {
		var missing netlink.LinkNotFoundError
		if errors.As(err, &missing) {
			return false, nil
		}
		return false, fmt.Errorf("looking up link %s: %w", DummyLink, err)
	}
	if err := netlink.LinkDel(link); err != nil {
		return false, fmt.Errorf("deleting link %s: %w", DummyLink, err)
	}
	return true, nil
}

// DestroySets destroys every ipset whose name mine accepts, and says
// which. The kernel keeps a set a rule still uses: those rules go first.
// Without the ipset tool or module there are no sets.
func DestroySets(mine func(name string) bool) ([]string, error) {
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return nil, nil
	}
	var destroyed []string
	var errs []error
	for _, name := range strings.Fields(string(out)) {
		if !mine(name) {
			continue
		}
		if out, err := exec.Command("ipset", "destroy", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %w: %s", name, err, strings.TrimSpace(string(out))))
			continue
		}
		destroyed = append(destroyed, name)
	}
	return destroyed, errors.Join(errs...)
}
