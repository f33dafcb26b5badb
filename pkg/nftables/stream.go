package nftables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"os/exec"
	"strings"

	"sigs.k8s.io/knftables"
)

// partOps is how many operations of a transaction a Streamer makes and
// writes at a time.
const partOps = 1000

// partsRunner is an nft that takes one transaction in parts (Streamer).
type partsRunner interface {
	runParts(ctx context.Context, parts iter.Seq[*knftables.Transaction]) error
}

// Streamer is knftables' nft that the syncer hands a transaction in parts,
// each written to the standard input of one `nft -f -` as soon as it is
// made: neither the whole transaction's objects nor its text are ever held
// at once (knftables' Run writes the whole text into a buffer it then
// keeps, 8 MB after a first sync at 10k services). nft applies the input
// all or nothing, as it does a transaction from knftables.
type Streamer struct {
	knftables.Interface
	// start runs `nft -f -`: its standard input, and the wait for its end.
	start func(ctx context.Context) (io.WriteCloser, func() error, error)
}

// NewStreamer streams nft's transactions through the nft on the PATH.
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

// runParts writes each part's text as knftables writes it. An invalid
// object fails the whole transaction: nft is killed before the end of its
// input, so it applies none of it.
func (s *Streamer) runParts(ctx context.Context, parts iter.Seq[*knftables.Transaction]) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	in, wait, err := s.start(ctx)
	if err != nil {
		return err
	}
	for tx := range parts {
		text := tx.String()
		// knftables writes an object's validation error as a last
		// comment line, and leaves out the operations from it on.
		if i := strings.Index(text, "# ERROR: "); i >= 0 && (i == 0 || text[i-1] == '\n') {
			cancel()
			_ = wait()
			return errors.New(text[i+len("# ERROR: "):])
		}
		if _, err := io.WriteString(in, text); err != nil {
			// nft stopped reading: its exit tells why.
			if waitErr := wait(); waitErr != nil {
				return waitErr
			}
			return fmt.Errorf("writing to nft: %w", err)
		}
	}
	if err := in.Close(); err != nil {
		cancel()
		_ = wait()
		return fmt.Errorf("writing to nft: %w", err)
	}
	return wait()
}
