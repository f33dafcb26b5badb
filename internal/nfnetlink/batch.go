package nfnetlink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Batch is one nf_tables transaction: messages sent together between a
// batch begin and a batch end, all of which the kernel applies or none
// (as one `nft -f`).
type Batch struct {
	family byte
	msgs   []byte
	// whats name each message for an error, in order.
	whats []string
}

// NewBatch starts a transaction on the family's tables.
func NewBatch(family byte) *Batch { return &Batch{family: family} }

// Add appends one nf_tables message (an NFT_MSG_ type) with its flags
// (NLM_F_REQUEST is set) and attributes; what names it in an error.
func (b *Batch) Add(msgType, flags uint16, attrs []byte, what string) {
	at := len(b.msgs)
	b.msgs = append(b.msgs, make([]byte, headerLen)...)
	b.msgs = append(b.msgs, attrs...)
	// The sequence numbers are set when the batch is sent.
	header(b.msgs[at:], unix.NFNL_SUBSYS_NFTABLES<<8|msgType, unix.NLM_F_REQUEST|flags, 0, b.family, 0)
	// Messages are 4-byte aligned; attributes already are.
	b.whats = append(b.whats, what)
}

// Len is the number of messages.
func (b *Batch) Len() int { return len(b.whats) }

// Messages are the batch's messages back to back (each a netlink header,
// nfgenmsg and attributes; sequence numbers are set by Send), as Send
// sends them between the batch's begin and end: what a test reads the
// kernel's work from without a kernel.
func (b *Batch) Messages() []byte { return slices.Clone(b.msgs) }

// String names the messages, a line each.
func (b *Batch) String() string { return strings.Join(b.whats, "\n") }

// Send sends the batch and returns the errors the kernel answered with,
// each naming its message (or the commit): when there is one, nothing of
// the batch was applied.
func (s *Socket) Send(b *Batch) error {
	if b.Len() == 0 {
		return nil
	}
	first := s.seq + 1
	s.seq += uint32(b.Len()) + 2
	begin := make([]byte, headerLen)
	header(begin, unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, first, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	end := make([]byte, headerLen)
	header(end, unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, s.seq, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	seq := first
	for at := 0; at < len(b.msgs); at += int(binary.NativeEndian.Uint32(b.msgs[at:])) {
		seq++
		binary.NativeEndian.PutUint32(b.msgs[at+8:], seq)
	}
	msg := make([]byte, 0, len(begin)+len(b.msgs)+len(end))
	msg = append(append(append(msg, begin...), b.msgs...), end...)
	// The kernel refuses a message larger than the send buffer; as nft,
	// grow it to fit the batch.
	if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, len(msg)+4096); err != nil {
		if err := unix.SetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, len(msg)+4096); err != nil {
			return fmt.Errorf("sizing the netlink send buffer: %w", err)
		}
	}
	if err := unix.Sendto(s.fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending a batch of %d messages: %w", b.Len(), err)
	}
	// The kernel runs the batch within the send and queues its errors
	// (one per failed message; a failed commit answers the batch begin)
	// before the send returns: what is queued now is all.
	var errs []error
	for {
		msgs, err := s.receive(unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			break
		}
		if err != nil {
			// An overrun loses answers: the outcome is unknown.
			return fmt.Errorf("reading the answers to a batch of %d messages: %w", b.Len(), err)
		}
		for _, m := range msgs {
			if m.Header.Type != unix.NLMSG_ERROR || len(m.Data) < 4+unix.SizeofNlMsghdr {
				continue
			}
			errno := errnoOf(m)
			seq := binary.NativeEndian.Uint32(m.Data[4+8:])
			switch {
			case errno == 0 || seq < first || seq > s.seq:
			case seq == first || seq == s.seq:
				errs = append(errs, fmt.Errorf("committing the transaction: %w", errno))
			default:
				errs = append(errs, fmt.Errorf("%s: %w", b.whats[seq-first-1], errno))
			}
		}
	}
	return errors.Join(errs...)
}
