package testutil

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// unroutedSkips are the skips allowed not to go through Skip, by file and
// function, each with why it must not fail under StrictEnv. A skip under
// `if testing.Short()` (a run that asked for less) needs no entry.
var unroutedSkips = map[string]string{
	"internal/testutil/root.go Skip":                        "the helper itself",
	"internal/ipvs/vm_test.go TestKernelInGuest":            "the half of TestKernelInVM that runs inside the VM it boots; on the host there is nothing for it to do",
	"test/vm/upstream_test.go TestRecordUpstreamIPVSLayout": "a recording tool that rewrites testdata, run only when asked for by its variable",
	"test/vm/realnode_cost_test.go TestRealNodeCostInGuest": "a measurement run by hand (build tag nodecost) with the node tools it names",
}

// Every t.Skip, t.Skipf and t.SkipNow in the repository goes through
// Skip (which fails under StrictEnv, as CI runs), sits under `if
// testing.Short()`, or is one of unroutedSkips: a test needing root, a
// program or a kernel feature cannot pass in CI without running.
func TestEverySkipIsRouted(t *testing.T) {
	root := repoRoot(t)
	seen := map[string]bool{}
	var unrouted []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			// What the go tool leaves out, and build output (_output).
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		skips, err := skipCalls(path)
		if err != nil {
			return err
		}
		for _, s := range skips {
			key := filepath.ToSlash(rel) + " " + s.function
			if _, ok := unroutedSkips[key]; ok {
				seen[key] = true
				continue
			}
			unrouted = append(unrouted, fmt.Sprintf("%s:%d: %s in %s", filepath.ToSlash(rel), s.line, s.call, s.function))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range unrouted {
		t.Errorf("%s: route it through testutil.Skip (it fails under %s), put it under `if testing.Short()`, or allow it in unroutedSkips with the reason", u, StrictEnv)
	}
	for key := range unroutedSkips {
		if !seen[key] {
			t.Errorf("unroutedSkips allows %q, which has no such skip any more", key)
		}
	}
}

// skipCall is a call of a test's Skip, Skipf or SkipNow.
type skipCall struct {
	call, function string
	line           int
}

// skipCalls lists a file's calls of X.Skip, X.Skipf and X.SkipNow (X not
// this package) outside `if testing.Short() { ... }`, with the function
// each is in.
func skipCalls(path string) ([]skipCall, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var calls []skipCall
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		var inspect func(n ast.Node) bool
		inspect = func(n ast.Node) bool {
			if ifs, ok := n.(*ast.IfStmt); ok && isTestingShort(ifs.Cond) {
				// Its body may skip; its else branch is checked as any code.
				if ifs.Init != nil {
					ast.Inspect(ifs.Init, inspect)
				}
				if ifs.Else != nil {
					ast.Inspect(ifs.Else, inspect)
				}
				return false
			}
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !slices.Contains([]string{"Skip", "Skipf", "SkipNow"}, sel.Sel.Name) {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && x.Name == "testutil" {
				return true
			}
			calls = append(calls, skipCall{call: exprText(sel), function: fn.Name.Name, line: fset.Position(call.Pos()).Line})
			return true
		}
		ast.Inspect(fn.Body, inspect)
	}
	return calls, nil
}

// isTestingShort tells whether a condition is exactly testing.Short().
func isTestingShort(cond ast.Expr) bool {
	call, ok := cond.(*ast.CallExpr)
	if !ok || len(call.Args) != 0 {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "testing" && sel.Sel.Name == "Short"
}

func exprText(sel *ast.SelectorExpr) string {
	if x, ok := sel.X.(*ast.Ident); ok {
		return x.Name + "." + sel.Sel.Name
	}
	return sel.Sel.Name
}

// repoRoot is the directory of the module's go.mod, above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			line, _ := bufio.NewReader(f).ReadString('\n')
			f.Close()
			if strings.TrimSpace(line) == "module github.com/rapidproxy/rapidproxy" {
				return dir
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/rapidproxy/rapidproxy above the test's directory")
		}
		dir = parent
	}
}
