package deploy

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// debianPackage is the Debian package that installs each program the
// binary may run. The image is Debian's, as this test assumes.
var debianPackage = map[string]string{
	"ipset":    "ipset",
	"nft":      "nftables",
	"modprobe": "kmod",
}

// iptablesTools are the names internal/iptables puts together (Runner.tool,
// DetectBackend), which a search of the source for literals cannot find:
// iptables or ip6tables, of either backend, as is or -save or -restore.
func iptablesTools() []string {
	var tools []string
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, backend := range []string{"legacy", "nft"} {
			for _, suffix := range []string{"", "-save", "-restore"} {
				tools = append(tools, base+"-"+backend+suffix)
			}
		}
	}
	return tools
}

// execLiteral finds the programs named as literals in exec.Command,
// exec.CommandContext and exec.LookPath calls.
var execLiteral = regexp.MustCompile(`exec\.(?:Command|CommandContext|LookPath)\((?:ctx, )?"([^"]+)"`)

// execedTools are the programs the kube-proxy binary may run: the literal
// names in the source of every package built into it (ours and our
// dependencies', knftables' nft among them), and the iptables tools.
func execedTools(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", `{{if not .Standard}}{{range .GoFiles}}{{$.Dir}}/{{.}}{{"\n"}}{{end}}{{end}}`, "./cmd/kube-proxy")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	tools := iptablesTools()
	for _, file := range strings.Fields(string(out)) {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range execLiteral.FindAllSubmatch(src, -1) {
			if tool := path.Base(string(m[1])); !slices.Contains(tools, tool) {
				tools = append(tools, tool)
			}
		}
	}
	return tools
}

// stage is one FROM stage of a Dockerfile, its instructions with
// continuation lines joined.
type stage []string

func dockerfileStages(t *testing.T) []stage {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var stages []stage
	var current string
	scanner := bufio.NewScanner(f)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			current += cont + " "
			continue
		}
		current += line
		if strings.HasPrefix(current, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], current)
		}
		current = ""
	}
	if err := scanner.Err(); err != nil {
		t.Fatal(err)
	}
	if len(stages) == 0 {
		t.Fatal("the Dockerfile has no FROM")
	}
	return stages
}

// aptPackages are the packages the stage's apt-get install commands name.
func (s stage) aptPackages() []string {
	var packages []string
	for _, instr := range s {
		for _, command := range strings.Split(instr, "&&") {
			words := strings.Fields(command)
			i := slices.Index(words, "install")
			if i < 1 || words[i-1] != "apt-get" {
				continue
			}
			for _, w := range words[i+1:] {
				if !strings.HasPrefix(w, "-") {
					packages = append(packages, w)
				}
			}
		}
	}
	return packages
}

// instruction is the arguments of the stage's last instruction of the
// kind.
func (s stage) instruction(kind string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if args, ok := strings.CutPrefix(s[i], kind+" "); ok {
			return args
		}
	}
	return ""
}

// The image's runtime stage installs, from Debian, every program the
// binary may run.
func TestImageHasEveryToolTheBinaryRuns(t *testing.T) {
	stages := dockerfileStages(t)
	runtime := stages[len(stages)-1]
	if from := runtime.instruction("FROM"); !strings.HasPrefix(from, "debian:") {
		t.Fatalf("the runtime stage is FROM %s; this test knows Debian's packages", from)
	}
	installed := runtime.aptPackages()
	for _, tool := range execedTools(t) {
		pkg, ok := debianPackage[tool]
		if !ok && (tool == "iptables" || strings.HasPrefix(tool, "iptables-") || strings.HasPrefix(tool, "ip6tables-")) {
			pkg, ok = "iptables", true
		}
		if !ok {
			t.Errorf("the binary may run %q: add its Debian package to debianPackage here and to the Dockerfile", tool)
			continue
		}
		if !slices.Contains(installed, pkg) {
			t.Errorf("the binary may run %s, from Debian's %s, which the Dockerfile's runtime stage does not install (it installs %v)", tool, pkg, installed)
		}
		checkOwner(t, tool, pkg)
	}
	// Not run by the binary, but in upstream's image, for looking at a
	// node's flows from the pod.
	if !slices.Contains(installed, "conntrack") {
		t.Errorf("the runtime stage does not install conntrack (it installs %v)", installed)
	}
}

// checkOwner checks, where this machine has dpkg and the tool installed,
// that the package installs it.
func checkOwner(t *testing.T, tool, pkg string) {
	t.Helper()
	out, err := exec.Command("dpkg-query", "-S", "*bin/"+tool).Output()
	if err != nil {
		return
	}
	var owners []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		names, file, ok := strings.Cut(line, ": ")
		if !ok || path.Base(file) != tool {
			continue
		}
		for _, name := range strings.Split(names, ", ") {
			if name, _, _ = strings.Cut(name, ":"); name == pkg {
				return
			}
			owners = append(owners, name)
		}
	}
	if len(owners) > 0 {
		t.Errorf("%s is installed by %v on this machine, not %s", tool, owners, pkg)
	}
}

// The image runs the binary at the path the DaemonSet's command and the
// systemd unit name, and its build stage stamps the version as the
// Makefile does.
func TestImageEntrypointIsTheDaemonSetsCommand(t *testing.T) {
	stages := dockerfileStages(t)
	runtime := stages[len(stages)-1]
	var entrypoint []string
	if err := json.Unmarshal([]byte(runtime.instruction("ENTRYPOINT")), &entrypoint); err != nil || len(entrypoint) == 0 {
		t.Fatalf("the runtime stage's ENTRYPOINT is not an exec-form list: %q", runtime.instruction("ENTRYPOINT"))
	}
	binary := entrypoint[0]
	copied := false
	for _, instr := range runtime {
		words := strings.Fields(instr)
		if words[0] == "COPY" && slices.Contains(words[1:len(words)-1], "/out/"+path.Base(binary)) && path.Clean(words[len(words)-1]) == path.Dir(binary) {
			copied = true
		}
	}
	if !copied {
		t.Errorf("no COPY of the build's %s to %s", path.Base(binary), path.Dir(binary))
	}
	for _, variant := range []string{Base, LeastPrivilege} {
		r, err := Render(variant)
		if err != nil {
			t.Fatal(err)
		}
		spec := r.DaemonSet.Spec.Template.Spec
		for _, c := range append(spec.InitContainers, spec.Containers...) {
			if len(c.Command) == 0 || c.Command[0] != binary {
				t.Errorf("deploy/%s: container %s runs %q, the image's entrypoint is %s", variant, c.Name, c.Command, binary)
			}
		}
	}
	unit, err := os.ReadFile("systemd/kube-proxy.service")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(unit), "\nExecStart="+binary+" ") {
		t.Errorf("deploy/systemd/kube-proxy.service does not run %s", binary)
	}
	const stamp = "-X github.com/rapidproxy/rapidproxy/pkg/version.gitVersion="
	makefile, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), stamp) || !strings.Contains(strings.Join(stages[0], "\n"), stamp) {
		t.Errorf("the Makefile and the Dockerfile's build stage should both stamp the version with %s", stamp)
	}
}

// imagePackages are the Debian packages `make image` installs
// (hack/image/packages.txt, one a line, # comments).
func imagePackages(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../hack/image/packages.txt")
	if err != nil {
		t.Fatal(err)
	}
	var packages []string
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			packages = append(packages, line)
		}
	}
	return packages
}

// `make image` and the Dockerfile install the same Debian packages.
func TestMakeImageInstallsTheDockerfilesPackages(t *testing.T) {
	stages := dockerfileStages(t)
	docker := slices.Sorted(slices.Values(stages[len(stages)-1].aptPackages()))
	ours := slices.Sorted(slices.Values(imagePackages(t)))
	if !slices.Equal(docker, ours) {
		t.Errorf("the Dockerfile installs %v, make image (hack/image/packages.txt) %v", docker, ours)
	}
}

// ourImage is the image `make image` builds: tagged with the VERSION
// file, which the binary's --version also prints.
func ourImage(t *testing.T) string {
	t.Helper()
	version, err := os.ReadFile("../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	return "ghcr.io/rapidproxy/kube-proxy:" + strings.TrimSpace(string(version))
}

// imageRef finds our image's references, and kustomize's newTag lines, in
// a manifest.
var imageRef = regexp.MustCompile(`(ghcr\.io/rapidproxy/kube-proxy:\S+)|newTag:\s*(\S+)`)

// Every manifest names the image `make image` builds, so a version bump
// cannot leave one behind: each file's references and newTag lines, and
// every container and init container of every rendered variant.
func TestManifestsNameTheVersionsImage(t *testing.T) {
	want := ourImage(t)
	_, tag, _ := strings.Cut(want, ":")
	files, err := filepath.Glob("*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range imageRef.FindAllStringSubmatch(string(data), -1) {
			seen++
			if (m[1] != "" && m[1] != want) || (m[2] != "" && m[2] != tag) {
				t.Errorf("deploy/%s names %q; the VERSION file's image is %s", f, m[0], want)
			}
		}
	}
	if seen == 0 {
		t.Fatal("no manifest names our image")
	}
	for _, variant := range Variants {
		var edits map[string]string
		if variant == ModeMigration {
			edits = map[string]string{"mode-migration/config.conf": TargetConfig(readFile(t, "base/config.conf"), "nftables")}
		}
		r, err := RenderEdited(variant, edits)
		if err != nil {
			t.Fatal(err)
		}
		for _, ds := range []*appsv1.DaemonSet{r.DaemonSet, r.Target} {
			if ds == nil {
				continue
			}
			spec := ds.Spec.Template.Spec
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				if c.Image != "" && c.Image != want {
					t.Errorf("deploy/%s: %s's container %s runs %s, want %s", variant, ds.Name, c.Name, c.Image, want)
				}
			}
		}
	}
}
