//go:build linux

package conntrack

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"github.com/mdlayher/socket"
	"golang.org/x/sys/unix"
)

// recvBufSize is the user buffer for one recvmsg. The kernel sizes dump
// datagrams by the largest buffer the reader offered, capped at 32 KiB; a
// larger buffer guarantees no truncation.
const recvBufSize = 64 << 10

// nlSock is one NETLINK_NETFILTER socket. Not goroutine-safe: each operation
// opens its own.
type nlSock struct {
	c   *socket.Conn
	pid uint32
	seq uint32
	buf []byte
	enc encoder
}

// openSock opens a ctnetlink socket in the network namespace netnsFD (0 =
// the caller's).
func openSock(netnsFD int) (*nlSock, error) {
	c, err := socket.Socket(unix.AF_NETLINK, unix.SOCK_RAW, unix.NETLINK_NETFILTER, "ctnetlink", &socket.Config{NetNS: netnsFD})
	if err != nil {
		return nil, fmt.Errorf("open ctnetlink socket: %w", err)
	}
	if err := c.Bind(&unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("bind ctnetlink socket: %w", err)
	}
	sa, err := c.Getsockname()
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("ctnetlink getsockname: %w", err)
	}
	nsa, ok := sa.(*unix.SockaddrNetlink)
	if !ok {
		_ = c.Close()
		return nil, fmt.Errorf("ctnetlink getsockname: unexpected address %T", sa)
	}
	// Acks need not echo the whole request back (Linux 4.3+; harmless if
	// refused).
	_ = c.SetsockoptInt(unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	return &nlSock{c: c, pid: nsa.Pid, buf: make([]byte, recvBufSize)}, nil
}

func (s *nlSock) Close() error { return s.c.Close() }

func (s *nlSock) nextSeq() uint32 {
	s.seq++
	if s.seq == 0 {
		s.seq = 1
	}
	return s.seq
}

func (s *nlSock) send(ctx context.Context, b []byte) error {
	if err := s.c.Sendto(ctx, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("ctnetlink send: %w", err)
	}
	return nil
}

// recv reads one datagram.
func (s *nlSock) recv(ctx context.Context) ([]byte, error) {
	n, _, flags, _, err := s.c.Recvmsg(ctx, s.buf, nil, 0)
	if err != nil {
		return nil, fmt.Errorf("ctnetlink receive: %w", err)
	}
	if flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("ctnetlink receive: datagram larger than %d bytes", len(s.buf))
	}
	return s.buf[:n], nil
}

// errDone stops a dump early from inside a callback.
var errDone = errors.New("stop")

// roundTrip sends the request in s.enc (sequence seq) and feeds every reply
// message of that sequence to fn until NLMSG_DONE or the final ack/error.
// fn may return errDone to stop reading (the socket must then be closed: the
// rest of the dump is still queued).
func (s *nlSock) roundTrip(ctx context.Context, seq uint32, fn func(h nlHeader, payload []byte) error) error {
	if err := s.send(ctx, s.enc.b); err != nil {
		return err
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := s.recv(ctx)
		if err != nil {
			return err
		}
		for len(b) > 0 {
			h, payload, rest, err := nextMessage(b)
			if err != nil {
				return err
			}
			b = rest
			if h.Seq != seq || h.PID != s.pid && h.PID != 0 {
				continue // not ours (stale reply of an aborted request)
			}
			switch h.Type {
			case nlmsgNoop:
				continue
			case nlmsgOverrun:
				return errors.New("ctnetlink: receive overrun")
			case nlmsgDone, nlmsgError:
				e, err := errnoOf(payload)
				if err != nil {
					if h.Type == nlmsgDone {
						return nil // old kernels send an empty DONE
					}
					return err
				}
				if e != 0 {
					return fmt.Errorf("ctnetlink: %w", syscall.Errno(-e))
				}
				return nil
			}
			if err := fn(h, payload); err != nil {
				return err
			}
		}
	}
}

// dumpByReplySource streams the kernel-filtered dump for b and calls fn for
// each decoded entry (f is reused: copy it to keep it). filtered reports
// whether the kernel flagged its messages NLM_F_DUMP_FILTERED.
func (s *nlSock) dumpByReplySource(ctx context.Context, b Backend, kernelFilter bool, fn func(f *Flow) error) (filtered bool, err error) {
	seq := s.nextSeq()
	s.enc.reset()
	s.enc.dumpRequest(seq, s.pid, b, kernelFilter)
	return s.streamFlows(ctx, seq, kernelFilter, fn)
}

// streamFlows sends the dump request in s.enc (sequence seq) and decodes
// each entry of the answer into one reused Flow for fn. filtered reports
// whether the kernel flagged its messages NLM_F_DUMP_FILTERED.
func (s *nlSock) streamFlows(ctx context.Context, seq uint32, kernelFilter bool, fn func(f *Flow) error) (filtered bool, err error) {
	var f Flow
	err = s.roundTrip(ctx, seq, func(h nlHeader, payload []byte) error {
		if h.Type>>8 != subsysCTNetlink {
			return nil
		}
		if kernelFilter && h.Flags&nlmFDumpFiltered != 0 {
			filtered = true
		}
		if err := decodeFlow(payload, &f); err != nil {
			return err
		}
		return fn(&f)
	})
	return filtered, err
}

// dumpByProto streams the dump of family fam, kernel-filtered by the
// original tuple's protocol when kernelFilter, calling fn for each decoded
// entry (f is reused).
func (s *nlSock) dumpByProto(ctx context.Context, fam, proto uint8, kernelFilter bool, fn func(f *Flow) error) (filtered bool, err error) {
	seq := s.nextSeq()
	s.enc.reset()
	s.enc.dumpProtoRequest(seq, s.pid, fam, proto, kernelFilter)
	return s.streamFlows(ctx, seq, kernelFilter, fn)
}

// deleteBatch deletes exactly the given entries (tuple + CTA_ID) with one
// sendmsg. Only the last request asks for an ack: netlink acks are one
// datagram each, and reading 250k of them costs more than the deletes.
// The kernel processes a sendmsg to NETLINK_NETFILTER synchronously and in
// order, so every error for the batch is queued before the final ack; a
// request without an error report succeeded.
func (s *nlSock) deleteBatch(ctx context.Context, flows []Flow) (deleted, vanished int, err error) {
	if len(flows) == 0 {
		return 0, 0, nil
	}
	s.enc.reset()
	first := s.seq + 1
	for i := range flows {
		s.enc.deleteRequest(s.nextSeq(), s.pid, &flows[i], i == len(flows)-1)
	}
	return s.collectAcks(ctx, first, len(flows), flows, false)
}

// createBatch creates the given entries (used by tests to build tables).
func (s *nlSock) createBatch(ctx context.Context, flows []Flow, timeout uint32) error {
	s.enc.reset()
	first := s.seq + 1
	for i := range flows {
		s.enc.createRequest(s.nextSeq(), s.pid, &flows[i], timeout)
	}
	ok, gone, err := s.collectAcks(ctx, first, len(flows), flows, true)
	if err == nil && ok != len(flows) {
		err = fmt.Errorf("created %d of %d entries (%d ENOENT)", ok, len(flows), gone)
	}
	return err
}

// collectAcks sends s.enc.b (n requests with sequences first..first+n-1)
// and reads the replies until the last request's ack or error. With
// ackEach every request carries NLM_F_ACK; otherwise only the last one and
// the requests without a reply succeeded. ENOENT counts as vanished; the
// first other error is returned after all replies were read.
func (s *nlSock) collectAcks(ctx context.Context, first uint32, n int, flows []Flow, ackEach bool) (ok, vanished int, err error) {
	if err := s.send(ctx, s.enc.b); err != nil {
		return 0, 0, err
	}
	last := first + uint32(n) - 1
	var failed int
	var firstErr error
	for done := false; !done; {
		b, err := s.recv(ctx)
		if err != nil {
			return ok, vanished, err
		}
		for len(b) > 0 {
			h, payload, rest, err := nextMessage(b)
			if err != nil {
				return ok, vanished, err
			}
			b = rest
			if h.Type != nlmsgError || h.Seq-first >= uint32(n) {
				continue
			}
			if h.Seq == last {
				done = true
			}
			e, err := errnoOf(payload)
			if err != nil {
				return ok, vanished, err
			}
			switch {
			case e == 0:
				if ackEach {
					ok++
				}
			case syscall.Errno(-e) == unix.ENOENT:
				vanished++
				failed++
			default:
				failed++
				if firstErr == nil {
					firstErr = fmt.Errorf("ctnetlink request for %s: %w", flows[h.Seq-first], syscall.Errno(-e))
				}
			}
		}
	}
	if !ackEach {
		ok = n - failed
	}
	return ok, vanished, firstErr
}

// statsCPU sums the per-CPU counters.
func (s *nlSock) statsCPU(ctx context.Context) (Stats, error) {
	var st Stats
	seq := s.nextSeq()
	s.enc.reset()
	s.enc.statsRequest(seq, s.pid, ctMsgGetStatsCPU)
	err := s.roundTrip(ctx, seq, func(h nlHeader, payload []byte) error {
		if h.Type != msgType(ctMsgGetStatsCPU) {
			return nil
		}
		return decodeStatsCPU(payload, &st)
	})
	if err == nil && st.CPUs == 0 {
		err = errors.New("ctnetlink: no per-CPU statistics returned")
	}
	return st, err
}

// statsGlobal returns the entry count of the socket's namespace and the
// global maximum (0 before Linux 4.18).
func (s *nlSock) statsGlobal(ctx context.Context) (Usage, error) {
	seq := s.nextSeq()
	s.enc.reset()
	off := s.enc.begin(msgType(ctMsgGetStats), nlmFRequest|nlmFAck, seq, s.pid, 0)
	s.enc.end(off)
	var u Usage
	var got bool
	err := s.roundTrip(ctx, seq, func(h nlHeader, payload []byte) error {
		if h.Type != msgType(ctMsgGetStats) {
			return nil
		}
		var err error
		u, err = decodeStatsGlobal(payload)
		got = err == nil
		return err
	})
	if err == nil && !got {
		err = errors.New("ctnetlink: no global statistics returned")
	}
	return u, err
}
