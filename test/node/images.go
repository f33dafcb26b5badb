//go:build realnode

package node

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// agnhostTools are the programs upstream's agnhost image has from its
// Alpine base (`apk add ... curl netcat-openbsd ...`) that busybox lacks
// or has in a form the tests cannot use: the tests run `nc -v -t -w 2`
// (openbsd's flags; busybox's nc has no -v), `curl`, and `wget -q -O -`
// (Alpine's is busybox's, but Debian's busybox wget segfaults on this
// machine, so it is GNU wget). They are this
// machine's Debian programs, with the shared libraries they load. The
// shell is dash, not busybox's: Debian's busybox shell runs its own
// applets before any program of the same name on PATH.
var agnhostTools = map[string]string{"/bin/nc": "/bin/nc.openbsd", "/bin/curl": "/usr/bin/curl", "/bin/sh": "/bin/dash",
	"/bin/wget": "/usr/bin/wget"}

// BuildAgnhostImage writes an agnhost image for the e2e tests to dir: what
// hack/build-node-tools.sh's has (agnhost, porter's certificate, busybox's
// applets) plus agnhostTools, under the same name, so that importing it
// after the node tools' images replaces theirs. It returns the archive.
func BuildAgnhostImage(tools, dir string) (string, error) {
	k8s, err := kubernetesSource()
	if err != nil {
		return "", err
	}
	version, err := os.ReadFile(filepath.Join(k8s, "test/images/agnhost/VERSION"))
	if err != nil {
		return "", err
	}
	porter := filepath.Join(k8s, "test/images/agnhost/porter")
	out := filepath.Join(dir, "agnhost-e2e.tar")
	args := []string{"-name", "registry.k8s.io/e2e-test-images/agnhost:" + strings.TrimSpace(string(version)), "-o", out,
		"-entrypoint", "/agnhost", "-cmd", "pause", "-file", "/agnhost=" + filepath.Join(tools, "agnhost"), "-link", "/agnhost-2=agnhost",
		"-file", "/localhost.crt=" + filepath.Join(porter, "localhost.crt"), "-file", "/localhost.key=" + filepath.Join(porter, "localhost.key"),
		"-file", "/bin/busybox=/bin/busybox"}
	applets, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return "", fmt.Errorf("busybox --list: %w", err)
	}
	for _, a := range strings.Fields(string(applets)) {
		if _, replaced := agnhostTools["/bin/"+a]; a != "busybox" && !replaced {
			args = append(args, "-link", "/bin/"+a+"=busybox")
		}
	}
	libs := map[string]bool{}
	for dst, src := range agnhostTools {
		if _, err := os.Stat(src); err != nil {
			return "", fmt.Errorf("%s (Debian's netcat-openbsd and curl): %w", src, err)
		}
		args = append(args, "-file", dst+"="+src)
		deps, err := sharedLibraries(src)
		if err != nil {
			return "", err
		}
		for _, l := range deps {
			libs[l] = true
		}
	}
	for l := range libs {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			return "", err
		}
		args = append(args, "-file", l+"="+real)
	}
	if out, err := exec.Command(filepath.Join(tools, "ociimage"), args...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("ociimage: %w: %s", err, out)
	}
	return out, nil
}

var lddPath = regexp.MustCompile(`(?m)(?:=>\s*)?(/\S+)\s+\(0x`)

// sharedLibraries are the paths ldd names for a program, the dynamic
// loader included.
func sharedLibraries(program string) ([]string, error) {
	out, err := exec.Command("ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", program, err)
	}
	var libs []string
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		libs = append(libs, m[1])
	}
	return libs, nil
}

// kubernetesSource is k8s.io/kubernetes's module directory, as
// hack/node-tools/kubernetes requires it.
func kubernetesSource() (string, error) {
	root, err := os.Getwd()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "k8s.io/kubernetes")
	cmd.Dir = filepath.Join(root, "..", "..", "hack", "node-tools", "kubernetes")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m k8s.io/kubernetes in %s: %w", cmd.Dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}
