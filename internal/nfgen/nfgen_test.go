package nfgen

import (
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// In a fresh namespace the generation stays put while nothing changes,
// moves by one per committed nft -f whatever it holds, and not with a
// transaction that fails.
func TestGeneration(t *testing.T) {
	testutil.RequireCommands(t, "nft")
	netns := testutil.NewNetns(t)
	testutil.DoInNetns(t, netns, func() {
		gen := func() uint64 {
			t.Helper()
			g, err := Generation()
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		nft := func(script string) error {
			cmd := exec.Command("nft", "-f", "-")
			cmd.Stdin = strings.NewReader(script)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Logf("nft: %v: %s", err, out)
			}
			return err
		}
		before := gen()
		if again := gen(); again != before {
			t.Fatalf("the generation moved with nothing done: %d -> %d", before, again)
		}
		if err := nft("add table ip t\nadd chain ip t a\nadd chain ip t b\nadd rule ip t a jump b\n"); err != nil {
			t.Fatal(err)
		}
		if after := gen(); after != before+1 {
			t.Errorf("one transaction moved the generation from %d to %d", before, after)
		}
		before = gen()
		if err := nft("flush chain ip t a\ndelete chain ip t nochain\n"); err == nil {
			t.Fatal("deleting a missing chain did not fail")
		}
		if after := gen(); after != before {
			t.Errorf("a failed transaction moved the generation from %d to %d", before, after)
		}
		if err := nft("list ruleset\n"); err != nil {
			t.Fatal(err)
		}
		if after := gen(); after != before {
			t.Errorf("a listing moved the generation from %d to %d", before, after)
		}
	})
}

// The foreign generation moves with another program's transaction, not
// with one of ours run through Write, failed or not.
func TestForeignGenerationLeavesOurWritesOut(t *testing.T) {
	testutil.RequireCommands(t, "nft")
	netns := testutil.NewNetns(t)
	testutil.DoInNetns(t, netns, func() {
		foreign := func() uint64 {
			t.Helper()
			g, err := ForeignGeneration()
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		nft := func(script string) error {
			cmd := exec.Command("nft", "-f", "-")
			cmd.Stdin = strings.NewReader(script)
			return cmd.Run()
		}
		before := foreign()
		if err := Write(func() error { return nft("add table ip ours\n") }); err != nil {
			t.Fatal(err)
		}
		if err := Write(func() error { return nft("delete chain ip ours nochain\n") }); err == nil {
			t.Fatal("deleting a missing chain did not fail")
		}
		if after := foreign(); after != before {
			t.Errorf("our writes moved the foreign generation from %d to %d", before, after)
		}
		if err := nft("add table ip theirs\n"); err != nil {
			t.Fatal(err)
		}
		if after := foreign(); after != before+1 {
			t.Errorf("another program's transaction moved the foreign generation from %d to %d", before, after)
		}
	})
}

// TableExists finds a table nft made, in its family only, and none before.
func TestTableExists(t *testing.T) {
	testutil.RequireCommands(t, "nft")
	netns := testutil.NewNetns(t)
	testutil.DoInNetns(t, netns, func() {
		exists := func(family uint8, name string) bool {
			t.Helper()
			ok, err := TableExists(family, name)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		if exists(unix.NFPROTO_IPV4, "kube-proxy") {
			t.Fatal("a table in a fresh namespace")
		}
		if out, err := exec.Command("nft", "add", "table", "ip", "kube-proxy").CombinedOutput(); err != nil {
			t.Fatalf("nft: %v: %s", err, out)
		}
		if !exists(unix.NFPROTO_IPV4, "kube-proxy") {
			t.Error("the ip table nft added is not found")
		}
		if exists(unix.NFPROTO_IPV6, "kube-proxy") || exists(unix.NFPROTO_IPV4, "kube-prox") {
			t.Error("a table of another family or name is found")
		}
	})
}
