// Command ociimage writes a single-layer linux/amd64 image as an OCI archive
// that `ctr images import` loads under the given name. The real nodes' images
// are made here from local files because nothing may be pulled from a registry.
//
// Usage: ociimage -name registry.k8s.io/pause:3.10.2 -o pause.tar \
//
//	-entrypoint /pause -file /pause=/path/to/pause [-file dst=src ...] [-link dst=target ...]
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type pairs []string

func (p *pairs) String() string     { return strings.Join(*p, ",") }
func (p *pairs) Set(s string) error { *p = append(*p, s); return nil }

func main() {
	var files, links pairs
	ref := flag.String("name", "", "image reference, e.g. registry.k8s.io/pause:3.10.2")
	out := flag.String("o", "", "output OCI archive (.tar)")
	entry := flag.String("entrypoint", "", "entrypoint, space separated")
	cmd := flag.String("cmd", "", "default command, space separated")
	user := flag.String("user", "", "user to run as, e.g. 65535:65535")
	flag.Var(&files, "file", "dst=src: put the local file src at dst in the image (repeatable)")
	flag.Var(&links, "link", "dst=target: a symlink in the image (repeatable)")
	flag.Parse()
	if *ref == "" || *out == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*ref, *out, *entry, *cmd, *user, files, links); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(ref, out, entry, cmd, user string, files, links pairs) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	layerTar, err := buildLayer(files, links)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return err
	}
	// OCI media types throughout; the library's empty image is Docker's.
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer})
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Config.Entrypoint = strings.Fields(entry)
	cfg.Config.Cmd = strings.Fields(cmd)
	cfg.Config.User = user
	cfg.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}

	// An OCI layout directory, tarred: the archive format `ctr images import`
	// reads. The image name goes in both annotations containerd's own exporter
	// writes, so the import needs no --base-name.
	dir, err := os.MkdirTemp("", "ociimage")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	err = p.AppendImage(img,
		layout.WithPlatform(v1.Platform{OS: "linux", Architecture: "amd64"}),
		layout.WithAnnotations(map[string]string{
			"io.containerd.image.name":          tag.Name(),
			"org.opencontainers.image.ref.name": tag.TagStr(),
		}))
	if err != nil {
		return err
	}
	return tarDir(dir, out)
}

// buildLayer makes the layer with its parent directories, so that the image
// needs no base.
func buildLayer(files, links pairs) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	mtime := time.Unix(0, 0)
	addDirs := func(p string) error {
		var parents []string
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			parents = append(parents, d)
		}
		sort.Strings(parents)
		for _, d := range parents {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("-file %q: want dst=src", f)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		st, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		if err := addDirs(dst); err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: int64(st.Mode().Perm()), Size: int64(len(data)), ModTime: mtime}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	for _, l := range links {
		dst, target, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("-link %q: want dst=target", l)
		}
		if err := addDirs(dst); err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(dst, "/"), Linkname: target, Mode: 0o777, ModTime: mtime}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func tarDir(dir, out string) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
