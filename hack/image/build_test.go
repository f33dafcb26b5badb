package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
)

// buildImage runs hack/build-image.sh ours into dir and returns the
// archive's bytes.
func buildImage(t *testing.T, dir string) []byte {
	t.Helper()
	cmd := exec.Command("../build-image.sh", "ours", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/build-image.sh: %v\n%s", err, stderr.Bytes())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	archive := lines[len(lines)-1]
	if archive != filepath.Join(dir, "rapidproxy-kube-proxy.tar") {
		t.Fatalf("hack/build-image.sh printed %q last", archive)
	}
	data, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// `make image` twice from the same commit gives the same archive, byte for
// byte, so the same manifest digest; its layers hold the programs
// kube-proxy runs, in both iptables backends with nft's the default, as
// Debian installs them, and our binaries where the DaemonSet runs them.
// The second build reuses the first's .debs (the tools cache), so this
// takes seconds.
func TestBuildIsReproducible(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the image twice")
	}
	testutil.RequireCommands(t, "apt-get", "dpkg-deb", "git")
	first := buildImage(t, t.TempDir())
	second := buildImage(t, t.TempDir())
	files, _, _ := readArchive(t, first)
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	secondFiles, _, _ := readArchive(t, second)
	var idx2 index
	if err := json.Unmarshal(secondFiles["index.json"], &idx2); err != nil {
		t.Fatal(err)
	}
	if idx.Manifests[0].Digest != idx2.Manifests[0].Digest || !bytes.Equal(first, second) {
		t.Fatalf("two builds differ: %s, %s", idx.Manifests[0].Digest, idx2.Manifests[0].Digest)
	}
	t.Logf("both builds: %s", idx.Manifests[0].Digest)

	version, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	if name := idx.Manifests[0].Annotations["io.containerd.image.name"]; name != "ghcr.io/rapidproxy/kube-proxy:"+strings.TrimSpace(string(version)) {
		t.Errorf("image name %q, want the VERSION file's tag", name)
	}
	var m manifest
	if err := json.Unmarshal(files[blobPath(idx.Manifests[0].Digest)], &m); err != nil {
		t.Fatal(err)
	}
	entries := map[string]*tar.Header{}
	for _, l := range m.Layers {
		zr, err := gzip.NewReader(bytes.NewReader(files[blobPath(l.Digest)]))
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(zr)
		for {
			hdr, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			entries["/"+strings.TrimSuffix(hdr.Name, "/")] = hdr
		}
	}
	for link, target := range map[string]string{
		"/usr/sbin/iptables":                  "/etc/alternatives/iptables",
		"/etc/alternatives/iptables":          "/usr/sbin/iptables-nft",
		"/etc/alternatives/ip6tables-restore": "/usr/sbin/ip6tables-nft-restore",
		"/usr/sbin/iptables-legacy-save":      "xtables-legacy-multi",
		"/usr/sbin/ip6tables-nft-save":        "xtables-nft-multi",
		"/sbin":                               "usr/sbin",
		"/lib":                                "usr/lib",
	} {
		if hdr := entries[link]; hdr == nil || hdr.Typeflag != tar.TypeSymlink || hdr.Linkname != target {
			t.Errorf("%s is not a link to %s: %+v", link, target, hdr)
		}
	}
	for _, p := range []string{"/usr/local/bin/kube-proxy", "/usr/local/bin/kube-proxy-explain", "/usr/sbin/xtables-nft-multi",
		"/usr/sbin/xtables-legacy-multi", "/usr/sbin/nft", "/usr/sbin/ipset", "/usr/sbin/conntrack", "/usr/bin/kmod",
		"/etc/protocols", "/etc/services", "/etc/passwd", "/etc/group", "/var/lib/dpkg/status.d/iptables"} {
		if hdr := entries[p]; hdr == nil || hdr.Typeflag != tar.TypeReg {
			t.Errorf("%s is not a file in the image: %+v", p, hdr)
		}
	}
	for p := range entries {
		if strings.HasPrefix(p, "/usr/share/man/") {
			t.Errorf("the image has manual pages: %s", p)
			break
		}
	}
}
