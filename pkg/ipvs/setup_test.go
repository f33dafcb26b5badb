package ipvs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ipvskernel "github.com/rapidproxy/rapidproxy/internal/ipvs"
	"github.com/rapidproxy/rapidproxy/pkg/ipvs"
)

// The scheduler's module loaded proves the scheduler without a request;
// without it, the check lists the virtual servers and probes with one, as
// upstream does, and names the module the kernel lacks.
func TestSchedulerCheckTrustsALoadedModule(t *testing.T) {
	modules := t.TempDir()
	if err := os.Mkdir(filepath.Join(modules, "ip_vs_rr"), 0o755); err != nil {
		t.Fatal(err)
	}
	k := ipvskernel.NewFake()
	if err := ipvs.CheckScheduler(k, modules, "rr", false); err != nil {
		t.Fatal(err)
	}
	if calls := k.Calls(); len(calls) != 0 {
		t.Errorf("with ip_vs_rr loaded the check made the calls %v, want none", calls)
	}
	if err := ipvs.CheckScheduler(k, modules, "wrr", false); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"VirtualServers": 1, "AddVirtualServer": 1, "DeleteVirtualServer": 1}
	if calls := k.Calls(); fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Errorf("without ip_vs_wrr loaded the check made the calls %v, want %v", calls, want)
	}
	err := ipvs.CheckScheduler(k, modules, "nosuch", false)
	if err == nil || !strings.Contains(err.Error(), "ip_vs_nosuch") {
		t.Errorf("a scheduler the kernel lacks: %v, want an error naming its module", err)
	}
}
