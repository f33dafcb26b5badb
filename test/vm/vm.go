package vm

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
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
	// Underlay, instead of Network, puts the guest's link on a bridge of
	// the caller's: any number of such VMs may run at once.
	Underlay *Underlay
	// MemoryMB is the guest's memory; zero means 2048.
	MemoryMB int
	// CPUs is the guest's number of CPUs (TCG runs one host thread per
	// CPU); zero means one.
	CPUs int
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
	m, err := Start(cfg, t.Logf)
	if errors.Is(err, errMissingTools) {
		testutil.Skip(t, "vm: "+err.Error())
	}
	if err != nil {
		t.Fatalf("vm: %v", err)
	}
	t.Cleanup(m.Stop)
	res, err := m.Wait()
	if err != nil {
		t.Fatalf("vm: %v", err)
	}
	t.Logf("vm: boot and script took %s", res.Elapsed.Round(time.Millisecond))
	return res
}

// Machine is a VM whose script may still be running, for a program that
// works with the guest meanwhile (the benchmark drives one over the
// network); tests use Run, which waits for the result.
type Machine struct {
	// OutDir is the host directory the guest sees as /out.
	OutDir string

	cfg     Config
	start   time.Time
	cmd     *exec.Cmd
	exited  chan struct{} // qemu has ended
	done    chan struct{} // the result line came, or qemu ended without one
	console strings.Builder
	verdict string
	undo    []func() // what Stop removes, last first
}

// Start boots a VM that runs cfg.Script and returns once qemu runs; logf
// gets the harness's messages and the console, line by line, until the
// result line. The caller must Stop it.
func Start(cfg Config, logf func(format string, args ...any)) (_ *Machine, err error) {
	if cfg.Network && cfg.Underlay != nil {
		return nil, errors.New("vm: Network and Underlay each give the guest its one link; set one of them")
	}
	img, err := prepared(logf)
	if err != nil {
		return nil, err
	}
	removeOrphans(logf)
	dir, err := os.MkdirTemp("", runDirPrefix)
	if err != nil {
		return nil, err
	}
	// Which process owns the directory, for removeOrphans; renamed into
	// place, so that it is never read half written.
	owner := filepath.Join(dir, ownerFile)
	err = os.WriteFile(owner+".new", []byte(framework.ProcessID(os.Getpid())), 0o644)
	if err == nil {
		err = os.Rename(owner+".new", owner)
	}
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	m := &Machine{OutDir: filepath.Join(dir, "out"), cfg: cfg, exited: make(chan struct{}), done: make(chan struct{}),
		undo: []func(){func() { _ = os.RemoveAll(dir) }}}
	defer func() {
		if err != nil {
			m.Stop()
		}
	}()
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := writeRunImage(initrd, img.initramfs, cfg); err != nil {
		return nil, fmt.Errorf("writing the initramfs: %w", err)
	}
	if err := os.Mkdir(m.OutDir, 0o755); err != nil {
		return nil, err
	}
	args := []string{
		"-accel", "tcg", "-m", strconv.Itoa(cmp.Or(cfg.MemoryMB, 2048)), "-smp", strconv.Itoa(cmp.Or(cfg.CPUs, 1)), "-nodefaults", "-nographic", "-no-reboot",
		// qboot, not SeaBIOS: as fast, and it prints nothing on the console.
		"-bios", "qboot.rom",
		"-serial", "stdio",
		"-kernel", img.kernel.boot, "-initrd", initrd,
		"-append", "console=ttyS0 panic=-1 quiet",
		"-fsdev", "local,id=out,path=" + m.OutDir + ",security_model=none",
		"-device", "virtio-9p-pci,fsdev=out,mount_tag=out",
	}
	if cfg.Network {
		removeTap, err := setUpTap(logf)
		if err != nil {
			return nil, err
		}
		m.undo = append(m.undo, removeTap)
		args = append(args, tapNIC(TapName, "")...)
	}
	qemu := []string{"qemu-system-x86_64"}
	if u := cfg.Underlay; u != nil {
		removeTap, err := u.setUp()
		if err != nil {
			return nil, err
		}
		m.undo = append(m.undo, removeTap)
		args = append(args, tapNIC(u.Tap, u.mac())...)
		// qemu opens the tap by its name in the bridge's namespace.
		qemu = []string{"ip", "netns", "exec", u.Netns, "qemu-system-x86_64"}
	}
	cmd := exec.Command(qemu[0], append(qemu[1:], args...)...)
	// qemu dies with the test binary, even one killed outright; in a process
	// group of its own, as the framework's processes, it does not get a
	// terminal's Ctrl-C, which is for the program to act on (Stop).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// A pipe of our own rather than StdoutPipe: Wait, run as soon as qemu
	// exits, would close that one under the reader and lose the last lines.
	serial, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	m.start = time.Now()
	// Pdeathsig fires when the thread that started qemu ends, not the
	// process: a thread the runtime retires (one a goroutine left locked
	// after a setns) would take qemu with it. qemu is started from a
	// thread that stays until qemu has exited.
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			_ = cmd.Wait()
			close(m.exited)
		}
	}()
	err = <-started
	w.Close()
	if err != nil {
		serial.Close()
		return nil, fmt.Errorf("starting qemu: %w", err)
	}
	m.cmd = cmd
	go m.readSerial(serial, logf)
	return m, nil
}

const (
	runDirPrefix = "rapidproxy-vm-"
	ownerFile    = "owner"
)

// removeOrphans removes the run directories (an initramfs of 80-150 MB
// each) of VMs whose process is gone without its Stop: a test binary or
// bench killed outright. A directory with no owner file yet is another
// Start's, a moment old.
func removeOrphans(logf func(format string, args ...any)) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), runDirPrefix+"*"))
	for _, dir := range dirs {
		owner, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil || framework.Running(string(owner)) {
			continue
		}
		if err := os.RemoveAll(dir); err == nil {
			logf("vm: removed %s, left by a killed run", dir)
		}
	}
}

// Done is closed once the guest has printed its result line, or qemu has
// ended without one.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Wait waits for the guest's result, until Config.Timeout after the start
// (zero: 5 minutes), and returns the run, or an error saying why it failed.
func (m *Machine) Wait() (*Result, error) {
	timeout := m.cfg.Timeout
	if timeout == 0 {
		timeout = 5 * time.Minute
	}
	select {
	case <-m.done:
	case <-time.After(time.Until(m.start.Add(timeout))):
		_ = m.cmd.Process.Kill()
		return nil, fmt.Errorf("no result line within %s", timeout)
	}
	elapsed := time.Since(m.start)
	if m.verdict == "" {
		return nil, fmt.Errorf("qemu exited without a result line (it ran %s)", elapsed.Round(time.Millisecond))
	}
	// The guest powers off right after the result; only a hung guest needs the kill.
	select {
	case <-m.exited:
	case <-time.After(10 * time.Second):
		_ = m.cmd.Process.Kill()
	}
	if m.verdict != "PASS" {
		return nil, fmt.Errorf("the guest says %s (after %s)", m.verdict, elapsed.Round(time.Millisecond))
	}
	return &Result{Console: m.console.String(), OutDir: m.OutDir, Elapsed: elapsed}, nil
}

// Stop ends qemu if it still runs and removes what Start made; it may be
// called more than once. Nothing is logged after it returns.
func (m *Machine) Stop() {
	if m.cmd != nil { // qemu started
		_ = m.cmd.Process.Kill()
		<-m.exited
		<-m.done // the serial pipe ends with qemu
	}
	for i := len(m.undo) - 1; i >= 0; i-- {
		m.undo[i]()
	}
	m.undo = nil
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

// readSerial logs the console line by line, keeps it, and records the
// verdict of the result line; then it reads what qemu still prints
// without logging it, so qemu never blocks on the pipe.
func (m *Machine) readSerial(serial *os.File, logf func(string, ...any)) {
	defer serial.Close()
	sc := bufio.NewScanner(serial)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		logf("vm| %s", line)
		m.console.WriteString(line + "\n")
		if _, verdict, found := strings.Cut(line, resultPrefix); found {
			m.verdict = verdict
			break
		}
	}
	close(m.done)
	_, _ = io.Copy(io.Discard, serial)
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
		if cfg.Underlay != nil {
			fmt.Fprintf(&env, "RPX_GUEST_CIDR=%s\nRPX_HOST_IP=\nRPX_ROUTES=\n", cfg.Underlay.GuestCIDR)
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
func prepared(logf func(string, ...any)) (*image, error) {
	prepareOnce.Do(func() {
		start := time.Now()
		prepareImg, prepareErr = prepare(logf)
		if prepareErr == nil {
			logf("vm: kernel %s and initramfs ready in %s", prepareImg.kernel.version, time.Since(start).Round(time.Millisecond))
		}
	})
	if prepareErr != nil {
		return nil, fmt.Errorf("preparing the kernel and initramfs: %w", prepareErr)
	}
	return prepareImg, nil
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

// tapNIC is the guest's one network card, on the host's tap named tap,
// with mac if it is not empty (else qemu's default). romfile= skips
// loading the network boot ROM, which -kernel never uses.
func tapNIC(tap, mac string) []string {
	device := "virtio-net-pci,netdev=net0,romfile="
	if mac != "" {
		device += ",mac=" + mac
	}
	return []string{"-netdev", "tap,id=net0,ifname=" + tap + ",script=no,downscript=no", "-device", device}
}
