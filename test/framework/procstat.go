package framework

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcUsage is what the kernel reports about a process's memory and CPU.
type ProcUsage struct {
	RSS     int64 // VmRSS, bytes
	PeakRSS int64 // VmHWM, bytes
	// CPU is user + system time so far, its own and that of the children
	// it has waited for: kube-proxy's work includes the iptables commands
	// it runs.
	CPU time.Duration
}

// clockTick is USER_HZ, the unit of /proc/PID/stat times; 100 on every
// Linux architecture Go supports without cgo to ask sysconf.
const clockTick = 10 * time.Millisecond

// ReadProcUsage reads /proc/PID/status and /proc/PID/stat.
func ReadProcUsage(pid int) (ProcUsage, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return ProcUsage{}, err
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcUsage{}, err
	}
	return ParseProcUsage(status, stat)
}

// ParseProcUsage reads a process's usage from the content of its
// /proc/PID/status and /proc/PID/stat, read on this machine or another.
func ParseProcUsage(status, stat []byte) (ProcUsage, error) {
	var u ProcUsage
	for _, line := range strings.Split(string(status), "\n") {
		key, value, _ := strings.Cut(line, ":")
		f := strings.Fields(value)
		if len(f) != 2 || f[1] != "kB" {
			continue
		}
		kb, _ := strconv.ParseInt(f[0], 10, 64)
		switch key {
		case "VmRSS":
			u.RSS = kb << 10
		case "VmHWM":
			u.PeakRSS = kb << 10
		}
	}
	f := parseStat(stat)
	if len(f) < 15 {
		return u, errors.New("cannot parse /proc/PID/stat")
	}
	// Fields 14 to 17 of stat (utime, stime, cutime, cstime): 11 to 14
	// after the name.
	for _, field := range f[11:15] {
		ticks, _ := strconv.ParseInt(field, 10, 64)
		u.CPU += time.Duration(ticks) * clockTick
	}
	return u, nil
}

// statFields are the fields of /proc/PID/stat after the command name
// (field 3 onwards), or nil when the process is gone.
func statFields(pid int) []string {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	return parseStat(data)
}

// parseStat splits the content of /proc/PID/stat after the command name,
// which may hold spaces: it counts from the name's end.
func parseStat(data []byte) []string {
	return strings.Fields(string(data[bytes.LastIndexByte(data, ')')+1:]))
}
