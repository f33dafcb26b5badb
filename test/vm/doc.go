// Package vm boots Debian's own kernel under qemu (TCG: no KVM needed) for
// tests that need kernel features the test machine may lack, IPVS first
// among them, and runs a test's shell script in it.
//
// Run is the API: it boots a VM with the test's files (static binaries,
// which BuildStatic makes of Go packages) and script, streams the serial
// console into the test log, and returns once the guest prints its result
// line ("RPX-VM-RESULT: PASS" or "RPX-VM-RESULT: FAIL <reason>"), or fails
// the test; a script that fails may first write the reason to
// /run/rpx-failure, which the result line then gives. The guest's /out is
// a host directory (Result.OutDir), for files the test reads back. For
// example:
//
//	probe := vm.BuildStatic(t, "./probe")
//	res := vm.Run(t, vm.Config{
//		Modules: []string{"ip_vs"},
//		Files:   map[string]string{"/usr/local/bin/probe": probe},
//		Network: true, // the guest reaches vm.HostIP and the cluster's API server
//		Script:  "ipvsadm -A -t 10.96.0.10:80 -s rr\nipvsadm -Ln >/out/ipvs.txt\n",
//	})
//	data, err := os.ReadFile(filepath.Join(res.OutDir, "ipvs.txt"))
//
// A program that works with the guest while its script runs (the
// benchmark, test/bench; the demo, test/demo) uses Start, then
// Machine.Wait and Machine.Stop.
//
// NodeFiles, NodeAddresses, NodeHelpers and IPVSModules make the guest
// node-1 of the local cluster (test/framework), with pods as namespaces
// in the guest.
//
// The image, cached under _output/vm:
//
//   - kernel/<package>: Debian's linux-image package behind
//     linux-image-amd64, fetched with apt-get download and unpacked with
//     dpkg-deb (never installed), its modules indexed with depmod, and the
//     vmlinux taken out of its bzImage for a faster boot (see kernel.boot).
//   - initramfs/<key>.cpio: init (init.sh), busybox, dash as /bin/sh, the
//     host's iptables (nft and legacy), ipset, ipvsadm, conntrack, ip, nft,
//     kmod and flock with their libraries, and the netfilter, IPVS, ipset and
//     bridge modules with their dependencies. The key hashes every input,
//     so an upgraded host package makes a new image.
//
// Each run appends a small archive with the script and the test's files.
//
// With Config.Network the guest gets a virtio NIC on a tap in the host
// namespace, and no route but these:
//
//	host (TapName) 10.255.4.1/30 - guest eth0 10.255.4.2
//	guest route    10.255.0.0/30 via 10.255.4.1: the local cluster's
//	               API server (test/framework) on 10.255.0.1
//
// The host does not forward what arrives on the tap, so no packet from
// the guest goes further than this machine's own addresses.
package vm
