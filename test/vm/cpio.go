package vm

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
)

// cpioWriter writes the "newc" cpio format, the one the kernel unpacks as
// an initramfs. Archives may be concatenated: the kernel reads on past each
// trailer, so a run's own files are appended to the cached base archive.
type cpioWriter struct {
	w    io.Writer
	ino  int
	made map[string]bool // directories and symlinks written, which mkdirAll skips
	err  error
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: w, ino: 1, made: map[string]bool{}}
}

// The mode bits cpio stores for each kind of entry.
const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

// header writes one entry's header and name; every number is 8 hex digits.
func (c *cpioWriter) header(name string, mode uint32, size int, rdevMajor, rdevMinor int) {
	if c.err != nil {
		return
	}
	c.ino++
	_, c.err = fmt.Fprintf(c.w, "070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\x00",
		c.ino, mode, 0, 0, 1, 0, size, 0, 0, rdevMajor, rdevMinor, len(name)+1, 0, name)
	c.pad(110 + len(name) + 1)
}

// pad aligns the stream to 4 bytes after n bytes written.
func (c *cpioWriter) pad(n int) {
	if c.err == nil && n%4 != 0 {
		_, c.err = c.w.Write(make([]byte, 4-n%4))
	}
}

// mkdirAll writes directory entries for p and its parents not written yet:
// the kernel creates no missing parents.
func (c *cpioWriter) mkdirAll(p string) {
	p = strings.TrimPrefix(path.Clean(p), "/")
	if p == "." || p == "" || c.made[p] {
		return
	}
	c.mkdirAll(path.Dir(p))
	c.made[p] = true
	c.header(p, cpioDir|0o755, 0, 0, 0)
}

// file writes a regular file with the given content.
func (c *cpioWriter) file(name string, perm fs.FileMode, data []byte) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, cpioFile|uint32(perm.Perm()), len(data), 0, 0)
	if c.err == nil {
		_, c.err = c.w.Write(data)
	}
	c.pad(len(data))
}

// copyFile writes the host file src (symlinks followed) as name.
func (c *cpioWriter) copyFile(name, src string) {
	data, err := os.ReadFile(src)
	if err != nil {
		c.err = err
		return
	}
	info, err := os.Stat(src)
	if err != nil {
		c.err = err
		return
	}
	c.file(name, info.Mode(), data)
}

func (c *cpioWriter) symlink(name, target string) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	c.mkdirAll(path.Dir(name))
	c.made[name] = true
	c.header(name, cpioSymlink|0o777, len(target), 0, 0)
	if c.err == nil {
		_, c.err = io.WriteString(c.w, target)
	}
	c.pad(len(target))
}

func (c *cpioWriter) charDev(name string, major, minor int) {
	name = strings.TrimPrefix(path.Clean(name), "/")
	c.mkdirAll(path.Dir(name))
	c.header(name, cpioCharDev|0o600, 0, major, minor)
}

// close writes the trailer and returns the first error.
func (c *cpioWriter) close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	return c.err
}
