package nftables

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"

	"sigs.k8s.io/knftables"
)

// streamRunner is an nft that takes a transaction as the text written to
// it (Streamer).
type streamRunner interface {
	runStream(ctx context.Context, write func(w *bufio.Writer) error) error
}

// Streamer is knftables' nft to which the syncer writes each transaction's
// text as it makes it, into the standard input of one `nft -f -`: neither
// the whole transaction's objects nor its text are ever held at once, nor
// kept after (knftables' Run writes the whole text into a buffer it then
// keeps: 8 MB after a first sync at 10k services). nft applies its input
// all or nothing, as it does a transaction from knftables.
type Streamer struct {
	knftables.Interface
	// start runs `nft -f -`: its standard input, and the wait for its end.
	start func(ctx context.Context) (io.WriteCloser, func() error, error)
}

// NewStreamer streams transactions on nft's table through the nft on the
// PATH.
func NewStreamer(nft knftables.Interface) (*Streamer, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("could not find nftables binary: %w", err)
	}
	return &Streamer{Interface: nft, start: func(ctx context.Context) (io.WriteCloser, func() error, error) {
		cmd := exec.CommandContext(ctx, path, "-f", "-")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, fmt.Errorf("running nft: %w", err)
		}
		return in, func() error {
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("nft -f -: %w: %s", err, strings.TrimSpace(stderr.String()))
			}
			return nil
		}, nil
	}}, nil
}

// runStream runs one `nft -f -` on what write writes. When writing fails
// (an invalid object), nft is killed before it reads the end of its input,
// so it applies none of it; when nft fails, its error says why.
func (s *Streamer) runStream(ctx context.Context, write func(w *bufio.Writer) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, wait, err := s.start(ctx)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(in, 64<<10)
	err = write(w)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = in.Close()
	}
	if err != nil {
		cancel()
		var exit *exec.ExitError
		if waitErr := wait(); errors.As(waitErr, &exit) && exit.Exited() {
			return waitErr
		}
		return err
	}
	return wait()
}
