package vm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// initScript is the guest's /init.
//
//go:embed init.sh
var initScript []byte

// layoutVersion is part of the initramfs cache key: bump it when the code
// below changes what goes into the image.
const layoutVersion = "2"

// moduleDirs are the module trees the image holds whole: every netfilter,
// conntrack, NAT, IPVS (schedulers included), ipset and bridge module, so
// that what kube-proxy, iptables and ipset make the kernel load on demand
// (through /sbin/modprobe, as on a node) is there.
var moduleDirs = []string{
	"kernel/net/netfilter", "kernel/net/ipv4/netfilter", "kernel/net/ipv6/netfilter", "kernel/net/bridge",
}

// moduleNames are the other modules the image holds: links for tests, the
// virtio devices qemu gives the guest (network, the /out share),
// crc32c_generic, which libcrc32c (needed by IPVS and conntrack) loads
// through a soft dependency that modules.dep does not list, and overlay,
// for a real node's container images (test/node's guest node).
var moduleNames = []string{"dummy", "veth", "virtio_pci", "virtio_net", "9p", "9pnet_virtio", "crc32c_generic", "overlay"}

// hostTools are the host's programs the guest runs, with their libraries.
// The real kmod, unlike busybox's modprobe, reads compressed modules and
// the aliases the kernel asks for; flock (util-linux', which busybox
// lacks) holds the xtables lock in the fault test.
var hostTools = []string{"xtables-nft-multi", "xtables-legacy-multi", "ipset", "ipvsadm", "conntrack", "ip", "nft", "kmod", "flock"}

// toolLinks are the names that run a multi-call tool. Plain iptables is
// the nft backend, Debian's default; a script may relink it.
func toolLinks() map[string]string {
	links := map[string]string{}
	for _, base := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-save", "-restore"} {
			links[base+suffix] = "xtables-nft-multi"
			links[base+"-nft"+suffix] = "xtables-nft-multi"
			links[base+"-legacy"+suffix] = "xtables-legacy-multi"
		}
	}
	for _, name := range []string{"modprobe", "insmod", "rmmod", "lsmod", "modinfo", "depmod"} {
		links[name] = "kmod"
	}
	return links
}

// The multiarch directory of the host's (and the guest's) libraries, and
// iptables' extensions there, which it loads with dlopen.
const (
	libDir      = "/usr/lib/x86_64-linux-gnu"
	xtablesDir  = libDir + "/xtables"
	busyboxPath = "/bin/busybox"
)

// entry is one file of the image: a copy of a host file, or a symlink.
type entry struct {
	src  string
	link string
}

// manifest maps guest paths to their entries.
type manifest map[string]entry

// baseManifest lists everything in the cached image but the kernel's
// modules: init, busybox and its applets, the host tools and their
// libraries, and the few /etc files the tools read.
func baseManifest() (manifest, error) {
	// The shell is dash, Debian's /bin/sh: busybox's own shell runs its
	// applets before anything on PATH, so its ip and modprobe would shadow
	// the real ones.
	dash, err := exec.LookPath("dash")
	if err != nil {
		return nil, err
	}
	m := manifest{
		"/usr/bin/busybox": {src: busyboxPath},
		"/usr/bin/dash":    {src: dash},
		"/usr/bin/sh":      {link: "dash"},
	}
	binaries := []string{busyboxPath, dash}
	taken := map[string]bool{"busybox": true, "sh": true}
	for _, name := range hostTools {
		p, err := exec.LookPath(name)
		if err != nil {
			return nil, fmt.Errorf("%s is not installed (hack/install-deps.sh installs it)", name)
		}
		m["/usr/sbin/"+name] = entry{src: p}
		binaries = append(binaries, p)
		taken[name] = true
	}
	for name, target := range toolLinks() {
		m["/usr/sbin/"+name] = entry{link: target}
		taken[name] = true
	}
	plugins, err := filepath.Glob(xtablesDir + "/*.so")
	if err != nil || len(plugins) == 0 {
		return nil, fmt.Errorf("no iptables extensions in %s", xtablesDir)
	}
	for _, p := range plugins {
		m[p] = entry{src: p}
	}
	binaries = append(binaries, plugins...)
	if err := addLibraries(m, binaries); err != nil {
		return nil, err
	}
	out, err := exec.Command(busyboxPath, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("busybox --list-full: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if !taken[path.Base(applet)] {
			m[usrPath("/"+applet)] = entry{link: "/usr/bin/busybox"}
		}
	}
	for _, f := range []string{"/etc/protocols", "/etc/services"} {
		m[f] = entry{src: f}
	}
	return m, nil
}

// usrPath maps a path to its place in the guest's merged /usr, where /bin,
// /sbin, /lib and /lib64 are symlinks into /usr, as on Debian.
func usrPath(p string) string {
	for _, dir := range []string{"/bin/", "/sbin/", "/lib/", "/lib64/"} {
		if strings.HasPrefix(p, dir) {
			return "/usr" + p
		}
	}
	return p
}

// addLibraries adds the dynamic loader and every shared library the ELF
// files need, transitively, found where the host's loader finds them.
func addLibraries(m manifest, files []string) error {
	seen := map[string]bool{}
	for len(files) > 0 {
		file := files[0]
		files = files[1:]
		f, err := elf.Open(file)
		if err != nil {
			return err
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				interp, err := io.ReadAll(p.Open())
				if err != nil {
					f.Close()
					return err
				}
				loader := strings.TrimRight(string(interp), "\x00")
				m[usrPath(loader)] = entry{src: loader}
			}
		}
		needed, err := f.ImportedLibraries()
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		for _, lib := range needed {
			if seen[lib] {
				continue
			}
			seen[lib] = true
			found := ""
			for _, dir := range []string{libDir, "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"} {
				if _, err := os.Stat(filepath.Join(dir, lib)); err == nil {
					found = filepath.Join(dir, lib)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("%s needs %s, which is not installed", file, lib)
			}
			m[libDir+"/"+lib] = entry{src: found}
			files = append(files, found)
		}
	}
	return nil
}

// moduleSet returns the modules to include, as paths relative to the
// modules directory, with every dependency modules.dep lists.
func moduleSet(k *kernel) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(k.modulesDir(), "modules.dep"))
	if err != nil {
		return nil, err
	}
	wanted := map[string]bool{}
	for _, n := range moduleNames {
		wanted[n] = true
	}
	set := map[string]bool{}
	found := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		mod, deps, _ := strings.Cut(sc.Text(), ":")
		name := moduleName(mod)
		include := wanted[name]
		for _, dir := range moduleDirs {
			include = include || strings.HasPrefix(mod, dir+"/")
		}
		if !include {
			continue
		}
		found[name] = true
		set[mod] = true
		// modules.dep lists the whole closure, not just direct dependencies.
		for _, d := range strings.Fields(deps) {
			set[d] = true
		}
	}
	for _, n := range moduleNames {
		if !found[n] {
			return nil, fmt.Errorf("kernel %s has no module %s", k.version, n)
		}
	}
	mods := make([]string, 0, len(set))
	for mod := range set {
		mods = append(mods, mod)
	}
	sort.Strings(mods)
	return mods, nil
}

// moduleName is the name modprobe knows a module file by.
func moduleName(file string) string {
	base := path.Base(file)
	base = base[:strings.Index(base, ".ko")]
	return strings.ReplaceAll(base, "-", "_")
}

// prepareInitramfs returns the cached base image for the kernel, building
// it when no image with the same content key exists.
func prepareInitramfs(cache string, k *kernel, logf func(string, ...any)) (string, error) {
	m, err := baseManifest()
	if err != nil {
		return "", err
	}
	mods, err := moduleSet(k)
	if err != nil {
		return "", err
	}
	for _, mod := range mods {
		m[usrPath("/lib/modules/"+k.version+"/"+mod)] = entry{src: filepath.Join(k.modulesDir(), mod)}
	}
	key, err := contentKey(k, m)
	if err != nil {
		return "", err
	}
	image := filepath.Join(cache, "initramfs", key+".cpio")
	if _, err := os.Stat(image); err == nil {
		return image, nil
	}
	logf("vm: building the initramfs %s (%d files, %d modules)", key, len(m), len(mods))
	// The guest's modules.dep and modules.alias describe only the modules
	// it holds: depmod on a copy of just those.
	stage, err := os.MkdirTemp(cache, ".stage-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(stage)
	stageMods := filepath.Join(stage, "lib", "modules", k.version)
	for _, f := range append(mods, "modules.order", "modules.builtin", "modules.builtin.modinfo") {
		if err := copyFile(filepath.Join(k.modulesDir(), f), filepath.Join(stageMods, f)); err != nil {
			return "", err
		}
	}
	if out, err := exec.Command("depmod", "-b", stage, k.version).CombinedOutput(); err != nil {
		return "", fmt.Errorf("depmod: %w: %s", err, out)
	}
	generated, err := filepath.Glob(filepath.Join(stageMods, "modules.*"))
	if err != nil {
		return "", err
	}
	for _, f := range generated {
		m[usrPath("/lib/modules/"+k.version+"/"+filepath.Base(f))] = entry{src: f}
	}
	// Images of earlier inputs are never used again.
	if stale, err := filepath.Glob(filepath.Join(cache, "initramfs", "*.cpio")); err == nil {
		for _, f := range stale {
			os.Remove(f)
		}
	}
	return image, writeAtomically(image, func(w io.Writer) error {
		c := newCPIOWriter(w)
		for _, dir := range []string{"bin", "sbin", "lib", "lib64"} {
			c.mkdirAll("usr/" + dir)
			c.symlink(dir, "usr/"+dir)
		}
		// The kernel gives init this console before /dev is mounted.
		c.charDev("dev/console", 5, 1)
		for _, dir := range []string{"proc", "sys", "run", "tmp", "out"} {
			c.mkdirAll(dir)
		}
		c.file("init", 0o755, initScript)
		writeManifest(c, m)
		return c.close()
	})
}

// writeManifest writes the entries in path order.
func writeManifest(c *cpioWriter, m manifest) {
	paths := make([]string, 0, len(m))
	for p := range m {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if e := m[p]; e.link != "" {
			c.symlink(p, e.link)
		} else {
			c.copyFile(p, e.src)
		}
	}
}

// contentKey hashes everything that goes into the image: the kernel,
// init, the layout code's version, and each file's path and content.
func contentKey(k *kernel, m manifest) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", layoutVersion, filepath.Base(k.dir), initScript)
	paths := make([]string, 0, len(m))
	for p := range m {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		e := m[p]
		fmt.Fprintf(h, "%s\x00%s\x00", p, e.link)
		if e.src != "" {
			f, err := os.Open(e.src)
			if err != nil {
				return "", err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return "", err
			}
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

// writeAtomically writes a file through a temporary name, so that a killed
// run leaves no half-written file under the final name.
func writeAtomically(name string, write func(io.Writer) error) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(name), ".tmp-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := write(bw); err != nil {
		f.Close()
		return err
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), name)
}
