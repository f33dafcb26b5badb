package framework

import (
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CleanupCgroups kills every process under the cgroup root (e.g. "/rpx-x")
// in every hierarchy and removes its cgroups, deepest first. A real node's
// kubelet makes them (kubepods, the QoS classes, one per pod and container)
// and nothing else removes them if it dies: the containers' processes are
// children of no process the framework started.
func CleanupCgroups(root string) {
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := 0
		for _, h := range hierarchies {
			left += removeTree(filepath.Join(h, root))
		}
		if left == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeTree kills the processes in the tree and removes its directories;
// it returns how many directories are left.
func removeTree(top string) int {
	var dirs []string
	_ = filepath.WalkDir(top, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	for _, d := range dirs {
		data, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// Deepest first: a cgroup with children cannot be removed.
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	left := 0
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !os.IsNotExist(err) {
			left++
		}
	}
	return left
}

// CreateCgroups makes the cgroup root in every v1 hierarchy: the kubelet
// checks that it exists and does not make it. cpuset's must be given the
// CPUs and memory nodes of its parent before it can hold anything.
func CreateCgroups(root string) error {
	hierarchies, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range hierarchies {
		dir := filepath.Join(h, root)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				data, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// cleanupLeftoverCgroups removes the cgroups a killed run's nodes left:
// every top-level cgroup named with the framework's prefix.
func cleanupLeftoverCgroups() {
	roots := map[string]bool{}
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + namePrefix + "*")
	for _, d := range dirs {
		roots["/"+filepath.Base(d)] = true
	}
	for root := range roots {
		CleanupCgroups(root)
	}
}
