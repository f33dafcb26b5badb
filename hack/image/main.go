// Command image writes the kube-proxy image (one file over 600 lines on
// purpose: the archive writer, the .deb unpacker and the alternatives are
// one pipeline that only this command runs, and splitting it into a package
// would export what nothing else uses).
//
// It writes the kube-proxy image as an archive that `ctr images
// import`, `docker load`, `podman load` and `skopeo copy oci-archive:...`
// read, with no container engine: an OCI image layout (oci-layout,
// index.json, blobs) that also holds Docker's manifest.json, tarred.
//
// The image has two layers: Debian's packages (each .deb's files, unpacked
// with dpkg-deb, into a merged-/usr root, plus what their maintainer scripts
// would make that the programs need: the update-alternatives links, such as
// iptables to iptables-nft; /etc/passwd and /etc/group; the usual empty
// directories), and the files given with -file (the kube-proxy binaries).
// Every entry of every tar is sorted, owned by root and stamped with -epoch,
// and nothing of the machine that builds it goes in, so the same inputs give
// the same image digest. hack/build-image.sh resolves the packages and runs
// it.
//
// Usage: image -name ghcr.io/rapidproxy/kube-proxy:v0.1.0 -o image.tar -epoch N \
//
//	-deb a.deb [-deb b.deb ...] -file /usr/local/bin/kube-proxy=PATH \
//	-entrypoint /usr/local/bin/kube-proxy [-annotation KEY=VALUE ...]
package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"sort"
	"strings"
	"time"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func main() {
	var debs, files, annotations, env list
	ref := flag.String("name", "", "the image's reference, e.g. ghcr.io/rapidproxy/kube-proxy:v0.1.0")
	out := flag.String("o", "", "the archive to write")
	entrypoint := flag.String("entrypoint", "", "the entrypoint, space separated")
	epoch := flag.Int64("epoch", 0, "every file's mtime and the image's creation time, in seconds since 1970 (say, the commit's time)")
	flag.Var(&debs, "deb", "a Debian package to unpack into the first layer (repeatable)")
	flag.Var(&files, "file", "dst=src: the local file src at dst in the second layer, mode 0755 (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE: an environment variable of the image's config (repeatable)")
	flag.Var(&annotations, "annotation", "KEY=VALUE: a label of the image's config and an annotation of its manifest (repeatable)")
	flag.Parse()
	if *ref == "" || *out == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	img := Image{Name: *ref, Epoch: time.Unix(*epoch, 0).UTC(), Entrypoint: strings.Fields(*entrypoint),
		Annotations: map[string]string{}, Env: env}
	for _, a := range annotations {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			fatal(fmt.Errorf("-annotation %q: want KEY=VALUE", a))
		}
		img.Annotations[k] = v
	}
	if len(debs) > 0 {
		root, err := DebianRoot(debs)
		if err != nil {
			fatal(err)
		}
		img.Layers = append(img.Layers, Layer{Tree: root.Tree, CreatedBy: "Debian packages: " + strings.Join(root.packages, " ")})
	}
	if len(files) > 0 {
		t := Tree{}
		for _, f := range files {
			dst, src, ok := strings.Cut(f, "=")
			if !ok {
				fatal(fmt.Errorf("-file %q: want dst=src", f))
			}
			data, err := os.ReadFile(src)
			if err != nil {
				fatal(err)
			}
			if err := t.Add(&Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: 0o755}, Data: data}); err != nil {
				fatal(err)
			}
		}
		var names []string
		for _, f := range files {
			dst, _, _ := strings.Cut(f, "=")
			names = append(names, dst)
		}
		img.Layers = append(img.Layers, Layer{Tree: t, CreatedBy: "COPY " + strings.Join(names, " ")})
	}
	sum, err := img.WriteArchive(*out)
	if err != nil {
		fatal(err)
	}
	fmt.Printf("image %s\ndigest %s\nlayers %d bytes compressed, %d bytes unpacked\n", *ref, sum.Digest, sum.Compressed, sum.Unpacked)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "image:", err)
	os.Exit(1)
}

// Entry is one file, directory or symlink of a layer. Header.Name is its
// absolute path; the layer's tar gets it relative, with the owner, mtime
// and format every entry shares.
type Entry struct {
	Header tar.Header
	Data   []byte
	// from is the package that put it there, for the error about a clash.
	from string
}

// Tree is a layer's entries by clean absolute path.
type Tree map[string]*Entry

// Add puts e in the tree, with any missing parent directories (mode 0755).
// A second directory at a path is merged with the first; a second file or
// link at a path must be the same as the first.
func (t Tree) Add(e *Entry) error {
	p := path.Clean("/" + e.Header.Name)
	if p == "/" {
		return nil
	}
	e.Header.Name = p
	for d := path.Dir(p); d != "/"; d = path.Dir(d) {
		if old, ok := t[d]; ok {
			if old.Header.Typeflag != tar.TypeDir {
				return fmt.Errorf("%s (%s): its parent %s is not a directory (%s)", p, e.from, d, old.from)
			}
			continue
		}
		t[d] = &Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}, from: e.from}
	}
	if old, ok := t[p]; ok {
		same := old.Header.Typeflag == e.Header.Typeflag && old.Header.Linkname == e.Header.Linkname &&
			bytes.Equal(old.Data, e.Data)
		if !same {
			return fmt.Errorf("%s is in both %s and %s, differently", p, old.from, e.from)
		}
		if e.Header.Typeflag == tar.TypeDir {
			// Explicit modes win over implicit parents'.
			old.Header.Mode = e.Header.Mode
		}
		return nil
	}
	t[p] = e
	return nil
}

// Layer is a tree and what made it, for the config's history.
type Layer struct {
	Tree      Tree
	CreatedBy string
}

// Tar is the layer's tar: entries sorted by path (so parents come first),
// owned by root, with mtime epoch and no other times.
func (t Tree) Tar(epoch time.Time) ([]byte, error) {
	paths := make([]string, 0, len(t))
	for p := range t {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := t[p]
		hdr := tar.Header{
			Typeflag: e.Header.Typeflag,
			Name:     strings.TrimPrefix(p, "/"),
			Linkname: e.Header.Linkname,
			Mode:     e.Header.Mode,
			ModTime:  epoch,
			Format:   tar.FormatPAX,
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			hdr.Name += "/"
		case tar.TypeReg:
			hdr.Size = int64(len(e.Data))
		case tar.TypeSymlink:
		default:
			return nil, fmt.Errorf("%s: unsupported tar type %q", p, hdr.Typeflag)
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Image is what the archive holds.
type Image struct {
	// Name is the full reference, registry/repository:tag.
	Name       string
	Epoch      time.Time
	Entrypoint []string
	// Env is added to the config's environment, after PATH.
	Env []string
	// Annotations go on the manifest and, as labels, in the config.
	Annotations map[string]string
	Layers      []Layer
}

// Summary is what WriteArchive reports.
type Summary struct {
	Digest     string
	Compressed int64 // the layers' blobs
	Unpacked   int64 // the layers' uncompressed tars
}

const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *platform         `json:"platform,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type history struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Created      string `json:"created"`
	Config       struct {
		Env        []string          `json:"Env"`
		Entrypoint []string          `json:"Entrypoint,omitempty"`
		Labels     map[string]string `json:"Labels,omitempty"`
	} `json:"config"`
	RootFS struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
	History []history `json:"history"`
}

type manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        descriptor        `json:"config"`
	Layers        []descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

// dockerManifest is an entry of `docker save`'s manifest.json, which
// `docker load` reads.
type dockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

// WriteArchive writes the image's archive to out (through out.tmp).
func (img *Image) WriteArchive(out string) (Summary, error) {
	var sum Summary
	blobs := map[string][]byte{}
	created := img.Epoch.Format(time.RFC3339)
	cfg := imageConfig{Architecture: "amd64", OS: "linux", Created: created}
	cfg.Config.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, img.Env...)
	cfg.Config.Entrypoint = img.Entrypoint
	cfg.Config.Labels = img.Annotations
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{}
	m := manifest{SchemaVersion: 2, MediaType: mediaManifest, Annotations: img.Annotations}
	docker := dockerManifest{RepoTags: []string{img.Name}}
	for _, l := range img.Layers {
		raw, err := l.Tree.Tar(img.Epoch)
		if err != nil {
			return sum, err
		}
		var gz bytes.Buffer
		zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		if err != nil {
			return sum, err
		}
		if _, err := zw.Write(raw); err != nil {
			return sum, err
		}
		if err := zw.Close(); err != nil {
			return sum, err
		}
		d := digest(gz.Bytes())
		blobs[d] = gz.Bytes()
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, digest(raw))
		cfg.History = append(cfg.History, history{Created: created, CreatedBy: l.CreatedBy})
		m.Layers = append(m.Layers, descriptor{MediaType: mediaLayer, Digest: d, Size: int64(gz.Len())})
		docker.Layers = append(docker.Layers, blobPath(d))
		sum.Compressed += int64(gz.Len())
		sum.Unpacked += int64(len(raw))
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return sum, err
	}
	m.Config = descriptor{MediaType: mediaConfig, Digest: digest(cfgJSON), Size: int64(len(cfgJSON))}
	blobs[m.Config.Digest] = cfgJSON
	docker.Config = blobPath(m.Config.Digest)
	mJSON, err := json.Marshal(m)
	if err != nil {
		return sum, err
	}
	sum.Digest = digest(mJSON)
	blobs[sum.Digest] = mJSON
	idx := index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{{
		MediaType: mediaManifest, Digest: sum.Digest, Size: int64(len(mJSON)),
		// containerd's importer names the image from the first, skopeo,
		// podman and OCI tools from the second.
		Annotations: map[string]string{"io.containerd.image.name": img.Name, "org.opencontainers.image.ref.name": img.Name},
		Platform:    &platform{Architecture: "amd64", OS: "linux"},
	}}}
	idxJSON, err := json.Marshal(idx)
	if err != nil {
		return sum, err
	}
	dockerJSON, err := json.Marshal([]dockerManifest{docker})
	if err != nil {
		return sum, err
	}
	archive := Tree{}
	files := map[string][]byte{
		"oci-layout":    []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json":    idxJSON,
		"manifest.json": dockerJSON,
	}
	for d, data := range blobs {
		files[blobPath(d)] = data
	}
	for name, data := range files {
		if err := archive.Add(&Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644}, Data: data}); err != nil {
			return sum, err
		}
	}
	data, err := archive.Tar(img.Epoch)
	if err != nil {
		return sum, err
	}
	if err := os.WriteFile(out+".tmp", data, 0o644); err != nil {
		return sum, err
	}
	return sum, os.Rename(out+".tmp", out)
}

// Root is the Debian layer's tree, with the packages it holds.
type Root struct {
	Tree
	packages []string
}

// mergedUsr are the top-level directories a merged-/usr system (Debian's
// since bookworm) has as links into /usr; a package's files there go to
// /usr.
var mergedUsr = []string{"bin", "sbin", "lib", "lib64"}

// excluded are what debian:bookworm-slim's dpkg configuration leaves out
// (/etc/dpkg/dpkg.cfg.d/docker): documentation but the copyright files,
// manual pages, translations.
func excluded(p string) bool {
	if strings.HasPrefix(p, "/usr/share/doc/") {
		return path.Base(p) != "copyright" && strings.Count(p, "/") > 4
	}
	for _, d := range []string{"/usr/share/man/", "/usr/share/info/", "/usr/share/locale/", "/usr/share/lintian/", "/usr/share/groff/", "/usr/share/linda/"} {
		if strings.HasPrefix(p, d) {
			return true
		}
	}
	return false
}

// usrPath is p on a merged-/usr system.
func usrPath(p string) string {
	for _, d := range mergedUsr {
		if p == "/"+d || strings.HasPrefix(p, "/"+d+"/") {
			return "/usr" + p
		}
	}
	return p
}

// DebianRoot unpacks the packages (in the order given: the caller sorts
// them) and does what their maintainer scripts would for a container's
// root.
func DebianRoot(debs []string) (*Root, error) {
	r := &Root{Tree: Tree{}}
	var alts alternatives
	for _, deb := range debs {
		ctrl, err := r.unpack(deb)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", deb, err)
		}
		name := controlField(ctrl["control"], "Package")
		if name == "" {
			return nil, fmt.Errorf("%s: no Package in its control file", deb)
		}
		r.packages = append(r.packages, name)
		// As distroless images record their packages, for scanners: the
		// control file, in /var/lib/dpkg/status.d.
		if err := r.Add(&Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: "/var/lib/dpkg/status.d/" + name, Mode: 0o644},
			Data: ctrl["control"], from: name}); err != nil {
			return nil, err
		}
		alts.parse(string(ctrl["postinst"]))
	}
	if err := alts.apply(r.Tree); err != nil {
		return nil, err
	}
	for _, d := range mergedUsr {
		if _, ok := r.Tree["/usr/"+d]; ok {
			if err := r.Add(&Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "/" + d, Linkname: "usr/" + d, Mode: 0o777}, from: "merged /usr"}); err != nil {
				return nil, err
			}
		}
	}
	for _, e := range baseFiles() {
		if err := r.Add(e); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// baseFiles are what a Debian root has that no package in the closure
// installs (base-files, base-passwd and the maintainer scripts make them).
func baseFiles() []*Entry {
	dir := func(p string, mode int64) *Entry {
		return &Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: p, Mode: mode}, from: "base"}
	}
	file := func(p, content string) *Entry {
		return &Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: 0o644}, Data: []byte(content), from: "base"}
	}
	return []*Entry{
		dir("/dev", 0o755), dir("/proc", 0o755), dir("/sys", 0o755), dir("/etc", 0o755),
		dir("/root", 0o700), dir("/home", 0o755),
		// /run holds xtables.lock (the DaemonSet mounts the node's there).
		dir("/run", 0o755), dir("/run/lock", 0o1777),
		dir("/tmp", 0o1777), dir("/var/tmp", 0o1777), dir("/var/lib", 0o755), dir("/var/log", 0o755),
		dir("/var/cache", 0o755),
		{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "/var/run", Linkname: "/run", Mode: 0o777}, from: "base"},
		file("/etc/passwd", "root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"),
		file("/etc/group", "root:x:0:\nnogroup:x:65534:\n"),
		file("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\nethers: files\nrpc: files\n"),
		// What kmod's postinst writes.
		file("/etc/modules", "# /etc/modules: kernel modules to load at boot time.\n"),
	}
}

// unpack adds the package's files to the tree and returns its control
// archive's files (control, postinst, ...) by name.
func (r *Root) unpack(deb string) (map[string][]byte, error) {
	ctrl := map[string][]byte{}
	err := readTar(exec.Command("dpkg-deb", "--ctrl-tarfile", deb), func(hdr *tar.Header, data []byte) error {
		if hdr.Typeflag == tar.TypeReg {
			ctrl[path.Base(hdr.Name)] = data
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	from := controlField(ctrl["control"], "Package")
	err = readTar(exec.Command("dpkg-deb", "--fsys-tarfile", deb), func(hdr *tar.Header, data []byte) error {
		p := usrPath(path.Clean("/" + hdr.Name))
		if p == "/" || excluded(p) {
			return nil
		}
		e := &Entry{Header: tar.Header{Typeflag: hdr.Typeflag, Name: p, Mode: hdr.Mode & 0o7777}, Data: data, from: from}
		switch hdr.Typeflag {
		case tar.TypeDir, tar.TypeReg:
		case tar.TypeSymlink:
			e.Header.Linkname = hdr.Linkname
			if strings.HasPrefix(hdr.Linkname, "/") {
				e.Header.Linkname = usrPath(hdr.Linkname)
			}
		default:
			return fmt.Errorf("%s: unsupported tar type %q", p, hdr.Typeflag)
		}
		return r.Add(e)
	})
	return ctrl, err
}

// readTar runs cmd and calls f for each entry of the tar it writes.
func readTar(cmd *exec.Cmd, f func(*tar.Header, []byte) error) error {
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	tr := tar.NewReader(stdout)
	var walkErr error
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			walkErr = err
			break
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			walkErr = err
			break
		}
		if walkErr = f(hdr, data); walkErr != nil {
			break
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil && walkErr == nil {
		walkErr = fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, stderr.Bytes())
	}
	return walkErr
}

// controlField is a field of a Debian control file.
func controlField(control []byte, name string) string {
	sc := bufio.NewScanner(bytes.NewReader(control))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// alternative is one `update-alternatives --install` of a maintainer
// script: a link group's master and slaves, each a link pointing to a path.
type alternative struct {
	priority int
	links    []altLink
}

type altLink struct{ link, name, path string }

// alternatives are the link groups by master name.
type alternatives map[string][]alternative

// parse reads every `update-alternatives --install LINK NAME PATH PRIORITY
// [--slave LINK NAME PATH]...` of a maintainer script.
func (a *alternatives) parse(script string) {
	if *a == nil {
		*a = alternatives{}
	}
	joined := strings.ReplaceAll(script, "\\\n", " ")
	for _, line := range strings.Split(joined, "\n") {
		words := strings.Fields(line)
		i := indexOf(words, "update-alternatives")
		if i < 0 {
			continue
		}
		words = words[i+1:]
		j := indexOf(words, "--install")
		if j < 0 || len(words) < j+5 {
			continue
		}
		var prio int
		if _, err := fmt.Sscan(words[j+4], &prio); err != nil {
			continue
		}
		alt := alternative{priority: prio, links: []altLink{{words[j+1], words[j+2], words[j+3]}}}
		rest := words[j+5:]
		for k := 0; k+3 < len(rest) && rest[k] == "--slave"; k += 4 {
			alt.links = append(alt.links, altLink{rest[k+1], rest[k+2], rest[k+3]})
		}
		(*a)[words[j+2]] = append((*a)[words[j+2]], alt)
	}
}

func indexOf(words []string, w string) int {
	for i, x := range words {
		if x == w {
			return i
		}
	}
	return -1
}

// apply makes each group's links for its highest priority alternative, as
// update-alternatives in automatic mode: LINK -> /etc/alternatives/NAME ->
// PATH.
func (a alternatives) apply(t Tree) error {
	for master, alts := range a {
		best := alts[0]
		for _, alt := range alts[1:] {
			if alt.priority > best.priority {
				best = alt
			}
		}
		for _, l := range best.links {
			if _, ok := t[usrPath(l.path)]; !ok {
				return fmt.Errorf("alternative %s: %s is in no package", master, l.path)
			}
			for _, e := range []*Entry{
				{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: "/etc/alternatives/" + l.name, Linkname: l.path, Mode: 0o777}},
				{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: usrPath(l.link), Linkname: "/etc/alternatives/" + l.name, Mode: 0o777}},
			} {
				e.from = "update-alternatives"
				if err := t.Add(e); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
