package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"
)

// readArchive is every regular file of a tar by name, and the names in
// the order the tar has them.
func readArchive(t *testing.T, data []byte) (map[string][]byte, []string, []*tar.Header) {
	t.Helper()
	files := map[string][]byte{}
	var names []string
	var headers []*tar.Header
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
		headers = append(headers, hdr)
		if hdr.Typeflag == tar.TypeReg {
			files[hdr.Name] = b
		}
	}
	return files, names, headers
}

func testImage(t *testing.T) *Image {
	t.Helper()
	tree := Tree{}
	for _, e := range []*Entry{
		{Header: tar.Header{Typeflag: tar.TypeReg, Name: "/usr/local/bin/kube-proxy", Mode: 0o755}, Data: []byte("binary")},
		{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "/usr/sbin/iptables", Linkname: "/etc/alternatives/iptables"}},
		{Header: tar.Header{Typeflag: tar.TypeDir, Name: "/tmp", Mode: 0o1777}},
	} {
		if err := tree.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	return &Image{Name: "ghcr.io/rapidproxy/kube-proxy:v0.1.0", Epoch: time.Unix(1700000000, 0),
		Entrypoint: []string{"/usr/local/bin/kube-proxy"}, Annotations: map[string]string{"org.opencontainers.image.version": "v0.1.0"},
		Layers: []Layer{{Tree: tree, CreatedBy: "test"}}}
}

// The archive is the same, byte for byte, each time, and holds what
// ctr (index.json with the name annotation), docker load (manifest.json)
// and OCI tools (oci-layout, blobs) read, every blob it names, and
// layers whose entries are sorted, root's and stamped with the epoch.
func TestArchiveIsReproducibleAndComplete(t *testing.T) {
	dir := t.TempDir()
	var archives [][]byte
	var digests []string
	for _, name := range []string{"a.tar", "b.tar"} {
		sum, err := testImage(t).WriteArchive(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		archives = append(archives, data)
		digests = append(digests, sum.Digest)
	}
	if digests[0] != digests[1] || !bytes.Equal(archives[0], archives[1]) {
		t.Fatalf("two writes differ: %s, %s", digests[0], digests[1])
	}
	files, names, _ := readArchive(t, archives[0])
	if !sort.StringsAreSorted(names) {
		t.Errorf("archive entries not sorted: %v", names)
	}
	var idx index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil || len(idx.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	d := idx.Manifests[0]
	if d.Digest != digests[0] || d.Annotations["io.containerd.image.name"] != "ghcr.io/rapidproxy/kube-proxy:v0.1.0" {
		t.Errorf("index.json's manifest: %+v", d)
	}
	if _, ok := files["oci-layout"]; !ok {
		t.Error("no oci-layout")
	}
	var m manifest
	if err := json.Unmarshal(files[blobPath(d.Digest)], &m); err != nil {
		t.Fatal(err)
	}
	if m.Annotations["org.opencontainers.image.version"] != "v0.1.0" {
		t.Errorf("manifest annotations: %v", m.Annotations)
	}
	var docker []dockerManifest
	if err := json.Unmarshal(files["manifest.json"], &docker); err != nil || len(docker) != 1 {
		t.Fatalf("manifest.json: %v %s", err, files["manifest.json"])
	}
	if docker[0].Config != blobPath(m.Config.Digest) || len(docker[0].Layers) != len(m.Layers) ||
		docker[0].RepoTags[0] != "ghcr.io/rapidproxy/kube-proxy:v0.1.0" {
		t.Errorf("manifest.json %+v does not match the OCI manifest %+v", docker[0], m)
	}
	var cfg imageConfig
	if err := json.Unmarshal(files[blobPath(m.Config.Digest)], &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.Entrypoint[0] != "/usr/local/bin/kube-proxy" || cfg.Config.Labels["org.opencontainers.image.version"] != "v0.1.0" {
		t.Errorf("config: %+v", cfg.Config)
	}
	for i, l := range m.Layers {
		blob, ok := files[blobPath(l.Digest)]
		if !ok || digest(blob) != l.Digest {
			t.Fatalf("layer %s missing or corrupt", l.Digest)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if digest(raw) != cfg.RootFS.DiffIDs[i] {
			t.Errorf("layer %d: diff ID %s, config says %s", i, digest(raw), cfg.RootFS.DiffIDs[i])
		}
		_, names, headers := readArchive(t, raw)
		want := []string{"tmp/", "usr/", "usr/local/", "usr/local/bin/", "usr/local/bin/kube-proxy", "usr/sbin/", "usr/sbin/iptables"}
		if len(names) != len(want) {
			t.Fatalf("layer entries %v, want %v", names, want)
		}
		for j, hdr := range headers {
			if hdr.Name != want[j] || hdr.Uid != 0 || hdr.Gid != 0 || hdr.Uname != "" || !hdr.ModTime.Equal(time.Unix(1700000000, 0)) {
				t.Errorf("entry %d: %s uid %d gid %d uname %q mtime %v; want %s, root's, epoch", j, hdr.Name, hdr.Uid, hdr.Gid, hdr.Uname, hdr.ModTime, want[j])
			}
		}
		if headers[0].Mode != 0o1777 {
			t.Errorf("/tmp mode %o", headers[2].Mode)
		}
	}
}

// A maintainer script's update-alternatives lines become the links of the
// highest priority, as Debian's iptables postinst makes iptables-nft the
// default.
func TestAlternatives(t *testing.T) {
	script := `#!/bin/sh
if [ "$1" = "configure" ]; then
	update-alternatives \
	  --install /usr/sbin/iptables iptables /usr/sbin/iptables-legacy 10 \
	  --slave /usr/sbin/iptables-save iptables-save /usr/sbin/iptables-legacy-save
        update-alternatives \
          --install /usr/sbin/iptables iptables /usr/sbin/iptables-nft 20 \
          --slave /usr/sbin/iptables-save iptables-save /usr/sbin/iptables-nft-save
fi
`
	tree := Tree{}
	for _, p := range []string{"/usr/sbin/iptables-legacy", "/usr/sbin/iptables-legacy-save", "/usr/sbin/iptables-nft", "/usr/sbin/iptables-nft-save"} {
		if err := tree.Add(&Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: p, Linkname: "xtables-multi"}}); err != nil {
			t.Fatal(err)
		}
	}
	var alts alternatives
	alts.parse(script)
	if err := alts.apply(tree); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"/usr/sbin/iptables":              "/etc/alternatives/iptables",
		"/etc/alternatives/iptables":      "/usr/sbin/iptables-nft",
		"/usr/sbin/iptables-save":         "/etc/alternatives/iptables-save",
		"/etc/alternatives/iptables-save": "/usr/sbin/iptables-nft-save",
	} {
		if e := tree[link]; e == nil || e.Header.Linkname != target {
			t.Errorf("%s: %+v, want a link to %s", link, e, target)
		}
	}
}

// Files of /bin, /sbin and /lib go to /usr, as on a merged-/usr system;
// documentation but copyright files is left out.
func TestPaths(t *testing.T) {
	for in, want := range map[string]string{"/bin/kmod": "/usr/bin/kmod", "/lib64/ld.so": "/usr/lib64/ld.so", "/libexec/x": "/libexec/x", "/etc/protocols": "/etc/protocols"} {
		if got := usrPath(in); got != want {
			t.Errorf("usrPath(%s) = %s, want %s", in, got, want)
		}
	}
	for p, want := range map[string]bool{"/usr/share/doc/iptables/copyright": false, "/usr/share/doc/iptables": false,
		"/usr/share/doc/iptables/changelog.gz": true, "/usr/share/man/man8/iptables.8.gz": true, "/usr/share/iptables/iptables.xslt": false} {
		if got := excluded(p); got != want {
			t.Errorf("excluded(%s) = %v, want %v", p, got, want)
		}
	}
}
