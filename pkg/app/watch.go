package app

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"
)

// fileIdentity is what changes when a file is rewritten or replaced; a
// ConfigMap update swaps a symlink, which changes the inode seen by Stat.
type fileIdentity struct {
	inode   uint64
	size    int64
	modTime time.Time
}

func identify(path string) (fileIdentity, error) {
	info, err := os.Stat(path)
	if err != nil {
		return fileIdentity{}, err
	}
	id := fileIdentity{size: info.Size(), modTime: info.ModTime()}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		id.inode = st.Ino
	}
	return id, nil
}

// fileWatch notices when a file changes or disappears.
type fileWatch struct {
	path    string
	initial fileIdentity
	// checked, if set, is called after each check that found the file
	// unchanged, so that tests wait for the watch instead of a time.
	checked func()
}

// watchFile records the file as it is now.
func watchFile(path string) (*fileWatch, error) {
	initial, err := identify(path)
	if err != nil {
		return nil, fmt.Errorf("watching config file: %w", err)
	}
	return &fileWatch{path: path, initial: initial}, nil
}

// wait returns an error once the file differs from when the watch began,
// and nil when the context ends. It sleeps until inotify reports a change
// to the file or its directory (where a ConfigMap mount swaps its
// symlinks), so an idle proxy does not wake up for it; where inotify is
// not to be had (its per-user instance limit is low), it checks the file
// every poll interval.
func (w *fileWatch) wait(ctx context.Context, poll time.Duration) error {
	events, err := inotifyOn(w.path, filepath.Dir(w.path))
	if err != nil {
		klog.V(2).InfoS("Polling the configuration file instead of watching it", "file", w.path, "err", err)
		return w.poll(ctx, poll)
	}
	stop := context.AfterFunc(ctx, func() { events.Close() })
	defer func() {
		if stop() {
			events.Close()
		}
	}()
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	// A change between watchFile and the watch's start has no event.
	for {
		if err := w.changed(); err != nil {
			return err
		}
		if w.checked != nil {
			w.checked()
		}
		if _, err := events.Read(buf); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("watching the configuration file %s: %w", w.path, err)
		}
	}
}

// poll checks the file every interval.
func (w *fileWatch) poll(ctx context.Context, every time.Duration) error {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if err := w.changed(); err != nil {
			return err
		}
		if w.checked != nil {
			w.checked()
		}
	}
}

// changed returns an error if the file differs from when the watch began.
func (w *fileWatch) changed() error {
	now, err := identify(w.path)
	if err != nil || now != w.initial {
		klog.InfoS("The configuration file changed; exiting so it is reloaded", "file", w.path)
		return fmt.Errorf("content of the configuration file %s was updated", w.path)
	}
	return nil
}

// inotifyOn returns a non-blocking inotify descriptor watching the paths
// (symlinks followed) for anything but reads.
func inotifyOn(paths ...string) (*os.File, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, err
	}
	// Non-blocking, so reads wait in the runtime's poller and Close ends them.
	events := os.NewFile(uintptr(fd), "inotify")
	const mask = unix.IN_ALL_EVENTS &^ (unix.IN_ACCESS | unix.IN_OPEN | unix.IN_CLOSE_NOWRITE)
	for _, path := range paths {
		if _, err := unix.InotifyAddWatch(fd, path, mask); err != nil {
			events.Close()
			return nil, fmt.Errorf("inotify on %s: %w", path, err)
		}
	}
	return events, nil
}
