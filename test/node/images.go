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
	ref, err := AgnhostImage()
	if err != nil {
		return "", err
	}
	porter := filepath.Join(k8s, "test/images/agnhost/porter")
	out := filepath.Join(dir, "agnhost-e2e.tar")
	args := []string{"-name", ref, "-o", out,
		"-entrypoint", "/agnhost", "-cmd", "pause", "-file", "/agnhost=" + filepath.Join(tools, "agnhost"), "-link", "/agnhost-2=agnhost",
		"-file", "/localhost.crt=" + filepath.Join(porter, "localhost.crt"), "-file", "/localhost.key=" + filepath.Join(porter, "localhost.key")}
	busybox, err := busyboxArgs(agnhostTools)
	if err != nil {
		return "", err
	}
	args = append(args, busybox...)
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

// AgnhostImage is the agnhost image the node tools and BuildAgnhostImage
// make: the tag of the pinned k8s.io/kubernetes module's
// test/images/agnhost/VERSION, as the e2e tests of that version name it.
func AgnhostImage() (string, error) {
	k8s, err := kubernetesSource()
	if err != nil {
		return "", err
	}
	version, err := os.ReadFile(filepath.Join(k8s, "test/images/agnhost/VERSION"))
	if err != nil {
		return "", err
	}
	return "registry.k8s.io/e2e-test-images/agnhost:" + strings.TrimSpace(string(version)), nil
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

// busyboxArgs are ociimage's arguments for Debian's static busybox at
// /bin/busybox with every applet linked in /bin, but those whose path
// replaced holds (an image's own programs there).
func busyboxArgs(replaced map[string]string) ([]string, error) {
	applets, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list: %w", err)
	}
	args := []string{"-file", "/bin/busybox=/bin/busybox"}
	for _, a := range strings.Fields(string(applets)) {
		if _, own := replaced["/bin/"+a]; a != "busybox" && !own {
			args = append(args, "-link", "/bin/"+a+"=busybox")
		}
	}
	return args, nil
}

// e2eImageTag is the tag the pinned e2e.test gives one of its images
// (test/utils/image/manifest.go's configs[key]), so that the images built
// here follow the suite's version.
func e2eImageTag(k8s, key string) (string, error) {
	manifest, err := os.ReadFile(filepath.Join(k8s, "test/utils/image/manifest.go"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`configs\[` + key + `\] = Config\{[^,]*, "[^"]*", "([^"]*)"\}`).FindSubmatch(manifest)
	if m == nil {
		return "", fmt.Errorf("no tag for %s in the e2e image manifest", key)
	}
	return string(m[1]), nil
}

// BuildConntrackTestImages writes to dir the two images the two-node
// Conntrack and KubeProxy tests run besides agnhost, and returns their
// archives, with the tags the pinned e2e.test names:
//   - distroless-iptables, which
//     the CLOSE_WAIT test runs as a privileged host-network pod to read
//     the node's /proc/net/nf_conntrack with `/bin/sh -c "cat ... | grep
//     -m 1 -E ..."`: busybox's sh, cat, grep and sleep do that;
//   - regression-issue-74839, the invalid-conntrack-state test's server,
//     built from the pinned module's test/images source.
func BuildConntrackTestImages(tools, dir string) ([]string, error) {
	busybox, err := busyboxArgs(nil)
	if err != nil {
		return nil, err
	}
	k8s, err := kubernetesSource()
	if err != nil {
		return nil, err
	}
	iptablesTag, err := e2eImageTag(k8s, "DistrolessIptables")
	if err != nil {
		return nil, err
	}
	regressionTag, err := e2eImageTag(k8s, "RegressionIssue74839")
	if err != nil {
		return nil, err
	}
	iptables := filepath.Join(dir, "distroless-iptables.tar")
	if out, err := exec.Command(filepath.Join(tools, "ociimage"), append([]string{
		"-name", "registry.k8s.io/build-image/distroless-iptables:" + iptablesTag, "-o", iptables, "-cmd", "/bin/sh"},
		busybox...)...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ociimage: %w: %s", err, out)
	}

	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	server := filepath.Join(dir, "regression-issue-74839")
	build := exec.Command("go", "build", "-o", server, "k8s.io/kubernetes/test/images/regression-issue-74839")
	build.Dir = filepath.Join(root, "..", "..", "hack", "node-tools", "kubernetes")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building regression-issue-74839: %w: %s", err, out)
	}
	regression := filepath.Join(dir, "regression-issue-74839.tar")
	if out, err := exec.Command(filepath.Join(tools, "ociimage"), append([]string{
		"-name", "registry.k8s.io/e2e-test-images/regression-issue-74839:" + regressionTag, "-o", regression,
		"-entrypoint", "/regression-issue-74839", "-file", "/regression-issue-74839=" + server},
		busybox...)...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ociimage: %w: %s", err, out)
	}
	return []string{iptables, regression}, nil
}
