#!/bin/sh
# PID 1 of the test VM (see doc.go), run by dash. Sets the machine up, runs
# the test's script from /rpx/script under `sh -e`, and ends with one result
# line on the serial console, which the host waits for, then powers off.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin HOME=/root

result() {
	echo "RPX-VM-RESULT: $*"
	sync
	poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /root
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
# The root is already in memory; a tmpfs on /tmp would hide the files a
# test put at host paths under it (a checkout in /tmp).
mkdir -p /tmp
hostname rpx-vm
ip link set lo up

# RPX_MODULES, RPX_GUEST_CIDR, RPX_HOST_IP, RPX_ROUTES: set by the harness.
. /rpx/env

modprobe -a virtio_pci 9pnet_virtio 9p || result "FAIL loading the 9p modules"
mount -t 9p -o trans=virtio,version=9p2000.L out /out || result "FAIL mounting /out"
if [ -n "$RPX_MODULES" ]; then
	modprobe -a $RPX_MODULES || result "FAIL modprobe $RPX_MODULES"
fi
if [ -n "$RPX_GUEST_CIDR" ]; then
	modprobe virtio_net &&
		ip addr add "$RPX_GUEST_CIDR" dev eth0 &&
		ip link set eth0 up || result "FAIL setting up eth0"
	for r in $RPX_ROUTES; do
		ip route add "$r" via "$RPX_HOST_IP" || result "FAIL adding the route to $r"
	done
fi

# A failing script may write why to /run/rpx-failure: the result line says it.
if sh -e /rpx/script; then
	result PASS
else
	status=$?
	result "FAIL $(head -n 1 /run/rpx-failure 2>/dev/null || echo "the script exited with status $status")"
fi
