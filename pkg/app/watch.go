package app

import (
	"context"
	"fmt"
	"os"
	"syscall"
	"time"

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
// and nil when the context ends.
func (w *fileWatch) wait(ctx context.Context, every time.Duration) error {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		now, err := identify(w.path)
		if err != nil || now != w.initial {
			klog.InfoS("The configuration file changed; exiting so it is reloaded", "file", w.path)
			return fmt.Errorf("content of the configuration file %s was updated", w.path)
		}
	}
}
