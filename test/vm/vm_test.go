package vm

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rapidproxy/rapidproxy/test/framework"
)

// TestVMBootsWithIPVS checks the image on its own: IPVS, a dummy link, an
// ipset, rules whose matches the kernel loads on demand, and a connection
// through an IPVS virtual server (masquerading) to a server in a network
// namespace.
func TestVMBootsWithIPVS(t *testing.T) {
	probe := BuildStatic(t, "./probe")
	res := Run(t, Config{
		Modules: []string{"ip_vs"},
		Files:   map[string]string{"/usr/local/bin/probe": probe},
		Script: `
uname -r
ip link add kube-ipvs0 type dummy
ip addr add 10.96.0.10/32 dev kube-ipvs0

ip netns add pod
ip link add veth-pod type veth peer name eth0 netns pod
ip addr add 10.244.0.1/24 dev veth-pod
ip link set veth-pod up
ip -n pod link set lo up
ip -n pod addr add 10.244.0.5/24 dev eth0
ip -n pod link set eth0 up
ip -n pod route add default via 10.244.0.1
ip netns exec pod probe -listen 10.244.0.5:8080 -name pod &

ipvsadm -A -t 10.96.0.10:80 -s rr
ipvsadm -a -t 10.96.0.10:80 -r 10.244.0.5:8080 -m
ipvsadm -Ln

ipset create KUBE-TEST hash:ip,port
ipset add KUBE-TEST 10.96.0.10,tcp:80
ipset list KUBE-TEST
# mangle OUTPUT sees the virtual address: IPVS rewrites it later, before filter.
iptables -t mangle -A OUTPUT -m comment --comment rpx-smoke -m set --match-set KUBE-TEST dst,dst -j MARK --set-xmark 0x4000/0x4000

got=$(probe -connect 10.96.0.10:80)
echo "client got: $got"
case "$got" in "pod saw 10.96.0.10:"*) ;; *) echo "unexpected answer"; exit 1;; esac
ipvsadm -Ln --stats
iptables-save -t mangle | grep -- '-m set --match-set KUBE-TEST dst,dst'
packets=$(iptables -t mangle -L OUTPUT -v -n -x | awk '/rpx-smoke/ {print $1}')
echo "marked packets: $packets"
[ "$packets" -gt 0 ]
lsmod | grep -E '^(ip_vs|ip_set_hash_ipport|xt_set|xt_comment|xt_mark) '
`,
	})
	if !strings.Contains(res.Console, "client got: pod saw 10.96.0.10:") {
		t.Errorf("the connection through IPVS is not in the console")
	}
}

// TestVMReachesHost connects from the guest, through the tap, to a
// listener the test opens on the host's end.
func TestVMReachesHost(t *testing.T) {
	probe := BuildStatic(t, "./probe")
	seen := make(chan string, 1)
	l := ListenOnHost(t)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "host saw %s\n", c.RemoteAddr())
			select {
			case seen <- c.RemoteAddr().String():
			default:
			}
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	res := Run(t, Config{
		Network: true,
		Files:   map[string]string{"/usr/local/bin/probe": probe},
		Script: fmt.Sprintf(`
ip addr show eth0
ip route
echo "client got: $(probe -connect %s:%d)"
`, HostIP, port),
	})
	select {
	case from := <-seen:
		if host, _, _ := net.SplitHostPort(from); host != GuestIP {
			t.Errorf("the host saw a connection from %s, want %s", from, GuestIP)
		}
	default:
		t.Errorf("no connection reached the host through %s", TapName)
	}
	sc := bufio.NewScanner(strings.NewReader(res.Console))
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "client got: host saw "+GuestIP+":") {
			return
		}
	}
	t.Errorf("the guest did not print the host's answer")
}

// A VM's run directory (its initramfs, 80-150 MB) whose process was killed
// without its Stop is removed by the next Start; a live process's, and one
// not yet marked with its owner, stay.
func TestOrphanedRunDirectoriesAreRemoved(t *testing.T) {
	gone := exec.Command("true")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	goneID := framework.ProcessID(gone.Process.Pid) // a zombie until Wait
	if err := gone.Wait(); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{"orphan": goneID, "live": framework.ProcessID(os.Getpid()), "starting": ""}
	paths := map[string]string{}
	for name, owner := range dirs {
		dir, err := os.MkdirTemp("", runDirPrefix)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		if owner != "" {
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(owner), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		paths[name] = dir
	}
	removeOrphans(t.Logf)
	for name, dir := range paths {
		_, err := os.Stat(dir)
		if removed := os.IsNotExist(err); removed != (name == "orphan") {
			t.Errorf("the %s directory: removed %v", name, removed)
		}
	}
}
