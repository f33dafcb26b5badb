package vm

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// kernel is Debian's kernel package, unpacked in the cache.
type kernel struct {
	dir     string // cache/kernel/<package>_<version>_amd64
	version string // what uname -r says: the modules directory's name
	// boot is what qemu loads with -kernel: the uncompressed vmlinux,
	// which qemu enters through its PVH ELF note, skipping the bzImage's
	// self-decompression. Under TCG that emulated xz run is most of a boot:
	// measured with a minimal initramfs on this kernel (6.1, xz), 2.1 s from
	// qemu's start to init for vmlinux against 5.0 s for the bzImage. The
	// bzImage stays the fallback for a kernel whose vmlinux has no PVH entry.
	boot string
}

func (k *kernel) root() string       { return filepath.Join(k.dir, "root") }
func (k *kernel) modulesDir() string { return filepath.Join(k.root(), "lib", "modules", k.version) }

// The package apt resolves to Debian's current kernel.
const kernelMetaPackage = "linux-image-amd64"

// prepareKernel returns the cached kernel, or downloads and unpacks it.
// Once one is cached it is used without asking apt, so warm runs need no
// network; `make clean` drops it, and the next run takes Debian's newest.
func prepareKernel(cache string, logf func(string, ...any)) (*kernel, error) {
	done, _ := filepath.Glob(filepath.Join(cache, "kernel", "*", ".complete"))
	if len(done) > 0 {
		return loadKernel(filepath.Dir(done[len(done)-1]))
	}
	logf("vm: downloading and unpacking Debian's %s (first run only)", kernelMetaPackage)
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get update: %w: %s", err, out)
	}
	pkg, err := resolveKernelPackage()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cache, "kernel"), 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(filepath.Join(cache, "kernel"), ".partial-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	download := exec.Command("apt-get", "download", "-qq", pkg)
	download.Dir = tmp
	if out, err := download.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("apt-get download %s: %w: %s", pkg, err, out)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return nil, fmt.Errorf("apt-get download %s left %d packages", pkg, len(debs))
	}
	// Unpacked, never installed: the host's own kernel is not touched.
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], filepath.Join(tmp, "root")).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dpkg-deb -x: %w: %s", err, out)
	}
	if err := os.Remove(debs[0]); err != nil {
		return nil, err
	}
	k, err := loadKernel(tmp)
	if err != nil {
		return nil, err
	}
	// The package ships no modules.dep: its postinst runs depmod.
	if out, err := exec.Command("depmod", "-b", k.root(), k.version).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("depmod: %w: %s", err, out)
	}
	if err := extractVmlinux(k.boot, filepath.Join(tmp, "vmlinux")); err != nil {
		logf("vm: booting the bzImage: %v", err)
	}
	if err := os.WriteFile(filepath.Join(tmp, ".complete"), nil, 0o644); err != nil {
		return nil, err
	}
	final := filepath.Join(cache, "kernel", strings.TrimSuffix(filepath.Base(debs[0]), ".deb"))
	if err := os.RemoveAll(final); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return nil, err
	}
	return loadKernel(final)
}

// resolveKernelPackage names the versioned package behind the metapackage
// (linux-image-6.1.0-56-amd64, say).
func resolveKernelPackage() (string, error) {
	out, err := exec.Command("apt-cache", "depends", kernelMetaPackage).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache depends %s: %w", kernelMetaPackage, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		dep, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "Depends: ")
		if ok && strings.HasPrefix(dep, "linux-image-") {
			return dep, nil
		}
	}
	return "", fmt.Errorf("no linux-image package among %s's dependencies:\n%s", kernelMetaPackage, out)
}

// loadKernel describes an unpacked package in dir.
func loadKernel(dir string) (*kernel, error) {
	entries, err := os.ReadDir(filepath.Join(dir, "root", "lib", "modules"))
	if err != nil {
		return nil, err
	}
	if len(entries) != 1 {
		return nil, fmt.Errorf("%s: expected one modules directory, found %d", dir, len(entries))
	}
	k := &kernel{dir: dir, version: entries[0].Name()}
	k.boot = filepath.Join(dir, "vmlinux")
	if _, err := os.Stat(k.boot); err != nil {
		k.boot = filepath.Join(dir, "root", "boot", "vmlinuz-"+k.version)
	}
	return k, nil
}

// xzMagic starts an xz stream; Debian compresses its kernels with xz.
var xzMagic = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}

// extractVmlinux does what the kernel's scripts/extract-vmlinux does for
// xz: decompress from the stream's magic on, and keep the result only if
// it is an ELF file, here one qemu can enter directly (a PVH note).
func extractVmlinux(bzImage, out string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	i := bytes.Index(data, xzMagic)
	if i < 0 {
		return errors.New("no xz stream in the bzImage")
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	// The bzImage goes on after the stream; --single-stream ignores that.
	cmd := exec.Command("xz", "-dc", "--single-stream")
	cmd.Stdin, cmd.Stdout = bytes.NewReader(data[i:]), f
	if err = cmd.Run(); err == nil {
		err = checkPVH(out)
	}
	if err != nil {
		os.Remove(out)
	}
	return err
}

// checkPVH checks that an ELF kernel has the Xen PVH entry note
// (XEN_ELFNOTE_PHYS32_ENTRY), which qemu needs to boot it.
func checkPVH(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	const phys32Entry = 18
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		notes := make([]byte, p.Filesz)
		if _, err := p.ReadAt(notes, 0); err != nil {
			return err
		}
		// Each note: name size, descriptor size, type, then the name and
		// the descriptor, each padded to 4 bytes.
		for len(notes) >= 12 {
			nameSize, descSize := binary.LittleEndian.Uint32(notes), binary.LittleEndian.Uint32(notes[4:])
			typ := binary.LittleEndian.Uint32(notes[8:])
			end := 12 + align4(nameSize) + align4(descSize)
			if uint64(len(notes)) < end {
				break
			}
			if typ == phys32Entry && string(notes[12:12+nameSize]) == "Xen\x00" {
				return nil
			}
			notes = notes[end:]
		}
	}
	return errors.New("vmlinux has no PVH entry note")
}

func align4(n uint32) uint64 { return (uint64(n) + 3) &^ 3 }
