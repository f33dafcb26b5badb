//go:build nodecost

package vm

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestRealNodeCostInGuest measures what a real node (the containerd, runc
// and kubelet of make e2e-upstream, test/node) costs in this TCG guest,
// the only place here with IPVS: containerd's start, an image import, a
// container run to its end, and a big Go binary's start; then the same
// steps on the host, for the ratio. A measurement, not in make test (its
// own build tag):
//
//	RAPIDPROXY_NODE_TOOLS=$(hack/build-node-tools.sh | tail -1) \
//	  go test -tags nodecost -run TestRealNodeCostInGuest -v ./test/vm
func TestRealNodeCostInGuest(t *testing.T) {
	tools := os.Getenv("RAPIDPROXY_NODE_TOOLS")
	if tools == "" {
		t.Skip("RAPIDPROXY_NODE_TOOLS is not set")
	}
	files := map[string]string{
		"/usr/local/bin/containerd":                 filepath.Join(tools, "containerd"),
		"/usr/local/bin/containerd-shim-runc-v2":    filepath.Join(tools, "containerd-shim-runc-v2"),
		"/usr/local/bin/ctr":                        filepath.Join(tools, "ctr"),
		"/usr/local/bin/kubelet":                    filepath.Join(tools, "kubelet"),
		"/rpx/images/busybox.tar":                   filepath.Join(tools, "images", "busybox.tar"),
		"/rpx/images/agnhost.tar":                   filepath.Join(tools, "images", "agnhost.tar"),
		"/usr/sbin/runc":                            "/usr/sbin/runc",
		"/usr/lib/x86_64-linux-gnu/libseccomp.so.2": "/lib/x86_64-linux-gnu/libseccomp.so.2",
	}
	res := Run(t, Config{Files: files, Timeout: 15 * time.Minute,
		Script: "mount -t cgroup2 none /sys/fs/cgroup\nD=/var/lib/rpx IMAGES=/rpx/images\n" + costScript})
	guest := costMarks(t, res.Console)

	dir := t.TempDir()
	cmd := exec.Command("sh", "-e", "-c", costScript)
	cmd.Env = append(os.Environ(), "D="+dir, "IMAGES="+filepath.Join(tools, "images"), "PATH="+tools+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("on the host: %v\n%s", err, out)
	}
	host := costMarks(t, string(out))
	for _, step := range []string{"containerd-ready", "import-busybox", "import-agnhost", "busybox-run-true", "agnhost-run-help", "kubelet-version"} {
		t.Logf("%-17s guest %7.2f s, host %6.2f s: %5.1fx", step, guest[step], host[step], guest[step]/host[step])
	}
}

// costScript prints "RPX-T <step> <seconds of uptime>" after each step,
// with containerd's files under $D and the image archives in $IMAGES. The
// guest's root is its initramfs, which has no overlay module and on which
// runc cannot pivot_root: images are unpacked by copying (the native
// snapshotter) and containers run with --no-pivot, on the host too.
const costScript = `
export CONTAINERD_SNAPSHOTTER=native
t() { echo "RPX-T $1 $(cut -d' ' -f1 /proc/uptime)"; }
mkdir -p "$D"
printf "version = 3\nroot = '%s'\nstate = '%s'\n[grpc]\n  address = '%s'\n" "$D/root" "$D/state" "$D/sock" >"$D/config.toml"
printf "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  BinaryName = '/usr/sbin/runc'\n" >>"$D/config.toml"
c() { ctr --address "$D/sock" -n rpx "$@"; }
t start
containerd --config "$D/config.toml" >"$D/containerd.log" 2>&1 &
pid=$!
trap 'kill $pid; wait $pid || true' EXIT
until c version >/dev/null 2>&1; do sleep 0.1; done
t containerd-ready
c images import --local "$IMAGES/busybox.tar" >/dev/null
t import-busybox
c images import --local "$IMAGES/agnhost.tar" >/dev/null
t import-agnhost
busybox=$(c images ls -q | grep busybox | head -n 1)
agnhost=$(c images ls -q | grep agnhost | head -n 1)
c run --rm --no-pivot "$busybox" rpx-cost-1 true
t busybox-run-true
c run --rm --no-pivot "$agnhost" rpx-cost-2 /agnhost --help >/dev/null
t agnhost-run-help
kubelet --version
t kubelet-version
`

var markLine = regexp.MustCompile(`RPX-T (\S+) ([0-9.]+)`)

// costMarks turns the marks into each step's duration in seconds.
func costMarks(t *testing.T, console string) map[string]float64 {
	steps := map[string]float64{}
	last := -1.0
	for _, m := range markLine.FindAllStringSubmatch(console, -1) {
		at, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatal(err)
		}
		if last >= 0 {
			steps[m[1]] = at - last
		}
		last = at
	}
	return steps
}
