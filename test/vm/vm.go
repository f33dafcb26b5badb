package vm

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rapidproxy/rapidproxy/internal/testutil"
	"github.com/rapidproxy/rapidproxy/test/framework"
)

// Config is what one VM runs.
type Config struct {
	// Script runs in the guest under `sh -e` (dash, with busybox's applets
	// and the real iptables, ipset, ipvsadm, ip, conntrack, nft and kmod);
	// the run passes if it exits 0. Its output goes to the serial console,
	// and it may write files to /out, which the host reads in Result.OutDir.
	Script string
	// Files are copied into the guest before it boots: guest path -> host
	// path. Binaries must be static (CGO_ENABLED=0 for Go).
	Files map[string]string
	// Modules are loaded with modprobe before the script runs. Others are
	// loaded on demand, as on a node, from the modules the image holds.
	Modules []string
	// Network links the guest to the host through a tap: the guest is
	// GuestIP and reaches HostIP and the local cluster's API server link
	// (APIServerRoute) through it, nothing else. One networked VM runs
	// on a machine at a time; Run waits for the other.
	Network bool
	// Timeout bounds the boot and the script; zero means 5 minutes.
	Timeout time.Duration
}

// Result is a run that passed.
type Result struct {
	// Console is everything the guest printed on its serial console.
	Console string
	// OutDir is the host directory the guest saw as /out.
	OutDir string
	// Elapsed is the time from qemu's start to the result line.
	Elapsed time.Duration
}

// resultPrefix starts the line init prints last: "PASS" or "FAIL <reason>".
const resultPrefix = "RPX-VM-RESULT: "

// Run boots a VM, runs cfg.Script in it, and returns once the guest has
// printed its result. The test fails if the script fails, or the guest
// prints no result in time. Run (and BuildStatic) skip under -short and
// without root (or, under RAPIDPROXY_NO_SKIP, fail). Every process and link
// it makes is removed when the test ends, however it ends.
func Run(t testing.TB, cfg Config) *Result {
	t.Helper()
	requireVM(t)
	img := prepared(t)
	dir := t.TempDir()
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := writeRunImage(initrd, img.initramfs, cfg); err != nil {
		t.Fatalf("vm: writing the initramfs: %v", err)
	}
	outDir := filepath.Join(dir, "out")
	if err := os.Mkdir(outDir, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{
		"-accel", "tcg", "-m", "2048", "-nodefaults", "-nographic", "-no-reboot",
		// qboot, not SeaBIOS: as fast, and it prints nothing on the console.
		"-bios", "qboot.rom",
		"-serial", "stdio",
		"-kernel", img.kernel.boot, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet",
		"-fsdev", "local,id=out,path=" + outDir + ",security_model=none",
		"-device", "virtio-9p-pci,fsdev=out,mount_tag=out",
	}
	if cfg.Network {
		setUpTap(t)
		// romfile= skips loading the network boot ROM, which -kernel never uses.
		args = append(args, "-netdev", "tap,id=net0,ifname="+TapName+",script=no,downscript=no",
			"-device", "virtio-net-pci,netdev=net0,romfile=")
	}
	cmd := exec.Command("qemu-system-x86_64", args...)
	// qemu dies with the test binary, even one killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// A pipe of our own rather than StdoutPipe: Wait, run as soon as qemu
	// exits, would close that one under the reader and lose the last lines.
	serial, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer serial.Close()
	cmd.Stdout, cmd.Stderr = w, w
	start := time.Now()
	err = cmd.Start()
	w.Close()
	if err != nil {
		t.Fatalf("vm: starting qemu: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	var console strings.Builder
	verdict, err := readSerial(t, serial, &console, timeout, cmd)
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("vm: %v (qemu ran %s)", err, elapsed.Round(time.Millisecond))
	}
	// The guest powers off right after the result; only a hung guest needs the kill.
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
	}
	if verdict != "PASS" {
		t.Fatalf("vm: the guest says %s (after %s)", verdict, elapsed.Round(time.Millisecond))
	}
	t.Logf("vm: boot and script took %s", elapsed.Round(time.Millisecond))
	return &Result{Console: console.String(), OutDir: outDir, Elapsed: elapsed}
}

// BuildStatic builds the Go main package pkg (a path as `go build` takes
// it, from the test's directory) as a static binary for Config.Files, and
// returns its path.
func BuildStatic(t testing.TB, pkg string) string {
	t.Helper()
	requireVM(t)
	out := filepath.Join(t.TempDir(), filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// requireVM skips a test that boots a VM under -short, and without root
// (or, under RAPIDPROXY_NO_SKIP, fails it).
func requireVM(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM")
	}
	testutil.RequireRoot(t)
}

// readSerial logs the console line by line and returns the verdict on the
// result line, or an error when qemu ends or time runs out first.
func readSerial(t testing.TB, serial io.Reader, console *strings.Builder, timeout time.Duration, cmd *exec.Cmd) (string, error) {
	lines := make(chan string)
	done := make(chan struct{})
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(serial)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			select {
			case lines <- strings.TrimRight(sc.Text(), "\r"):
			case <-done:
				return
			}
		}
	}()
	defer close(done)
	deadline := time.After(timeout)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				return "", errors.New("qemu exited without a result line")
			}
			t.Log("vm| " + line)
			console.WriteString(line + "\n")
			if _, verdict, found := strings.Cut(line, resultPrefix); found {
				return verdict, nil
			}
		case <-deadline:
			_ = cmd.Process.Kill()
			return "", fmt.Errorf("no result line within %s", timeout)
		}
	}
}

// writeRunImage writes the base image followed by a second archive with
// the run's script, settings and files.
func writeRunImage(name, base string, cfg Config) error {
	return writeAtomically(name, func(w io.Writer) error {
		f, err := os.Open(base)
		if err != nil {
			return err
		}
		_, err = io.Copy(w, f)
		f.Close()
		if err != nil {
			return err
		}
		c := newCPIOWriter(w)
		var env bytes.Buffer
		fmt.Fprintf(&env, "RPX_MODULES=%q\n", strings.Join(cfg.Modules, " "))
		if cfg.Network {
			fmt.Fprintf(&env, "RPX_GUEST_CIDR=%s/30\nRPX_HOST_IP=%s\nRPX_ROUTES=%q\n", GuestIP, HostIP, APIServerRoute)
		}
		c.file("rpx/env", 0o644, env.Bytes())
		c.file("rpx/script", 0o755, []byte(cfg.Script))
		for guest, host := range cfg.Files {
			c.copyFile(guest, host)
		}
		return c.close()
	})
}

// image is the cached kernel and base initramfs.
type image struct {
	kernel    *kernel
	initramfs string
}

var (
	prepareOnce sync.Once
	prepareImg  *image
	prepareErr  error
)

// prepared returns the kernel and base image, made once per process (and,
// through the cache, once per machine until an input changes).
func prepared(t testing.TB) *image {
	t.Helper()
	prepareOnce.Do(func() {
		start := time.Now()
		prepareImg, prepareErr = prepare(t.Logf)
		if prepareErr == nil {
			t.Logf("vm: kernel %s and initramfs ready in %s", prepareImg.kernel.version, time.Since(start).Round(time.Millisecond))
		}
	})
	if errors.Is(prepareErr, errMissingTools) {
		testutil.Skip(t, "vm: "+prepareErr.Error())
	}
	if prepareErr != nil {
		t.Fatalf("vm: preparing the kernel and initramfs: %v", prepareErr)
	}
	return prepareImg
}

// vmTools are the host programs the harness itself runs.
var vmTools = []string{"qemu-system-x86_64", "depmod", "xz", "dpkg-deb", "apt-get"}

func prepare(logf func(string, ...any)) (*image, error) {
	root, err := framework.RepoRoot()
	if err != nil {
		return nil, err
	}
	if err := installDeps(root, logf); err != nil {
		return nil, err
	}
	cache := filepath.Join(root, "_output", "vm")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, err
	}
	// Test binaries of several packages may prepare at once.
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, err
	}
	k, err := prepareKernel(cache, logf)
	if err != nil {
		return nil, err
	}
	initramfs, err := prepareInitramfs(cache, k, logf)
	if err != nil {
		return nil, err
	}
	return &image{kernel: k, initramfs: initramfs}, nil
}

// errMissingTools says a program the VM needs is not installed and could
// not be: a reason to skip, not a failure of the harness.
var errMissingTools = errors.New("missing programs")

// installDeps runs hack/install-deps.sh, which holds the project's one list
// of OS packages, when a program the VM needs is missing.
func installDeps(root string, logf func(string, ...any)) error {
	for _, name := range append(append([]string{busyboxPath}, vmTools...), hostTools...) {
		if _, err := exec.LookPath(name); err != nil {
			logf("vm: %s is missing; running hack/install-deps.sh", name)
			if out, err := exec.Command(filepath.Join(root, "hack", "install-deps.sh")).CombinedOutput(); err != nil {
				return fmt.Errorf("%w: %s, and hack/install-deps.sh failed: %v: %s", errMissingTools, name, err, out)
			}
			return nil
		}
	}
	return nil
}
