//go:build linux

package sockdiag

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"github.com/remediate-dev/remediate/internal/nfnetlink"
	"golang.org/x/sys/unix"
)

// The kernel's constants (include/uapi/linux/inet_diag.h, tcp_states.h).
const (
	tcpListen       = 10
	inetDiagCgroup  = 21 // INET_DIAG_CGROUP_ID
	sizeofReqV2     = 56 // struct inet_diag_req_v2
	sizeofInetMsg   = 72 // struct inet_diag_msg
	recvBufferBytes = 64 << 10
)

// Listeners returns the TCP sockets (IPv4 and IPv6) listening on one of
// ports (all ports when none is given) in the namespace of opts.
func Listeners(ctx context.Context, opts Options, ports ...uint16) ([]Listener, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	fd, err := openSocket(opts.NetNS)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	var out []Listener
	seen := 0
	for _, fam := range []uint8{unix.AF_INET, unix.AF_INET6} {
		err := dump(ctx, fd, fam, func(l Listener) error {
			seen++
			if seen > MaxSockets {
				return fmt.Errorf("more than %d listening TCP sockets", MaxSockets)
			}
			if len(ports) == 0 || slices.Contains(ports, l.Addr.Port()) {
				out = append(out, l)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("sock_diag dump of %s listening sockets: %w", famName(fam), err)
		}
	}
	return out, nil
}

func famName(f uint8) string {
	if f == unix.AF_INET6 {
		return "IPv6"
	}
	return "IPv4"
}

// openSocket opens a NETLINK_SOCK_DIAG socket in the namespace ns (""
// this process's): a socket stays in the namespace it was created in, so
// only its creation runs on a thread switched into ns.
func openSocket(ns string) (int, error) {
	open := func() (int, error) {
		fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
		if err != nil {
			return -1, fmt.Errorf("opening a sock_diag netlink socket: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("binding the sock_diag netlink socket: %w", err)
		}
		return fd, nil
	}
	if ns == "" {
		return open()
	}
	// nfnetlink.InNetNS locks the calling thread: run it on a goroutine
	// of its own.
	ch := make(chan int, 1)
	errc := make(chan error, 1)
	go func() {
		fd := -1
		errc <- nfnetlink.InNetNS(ns, func() error {
			var err error
			fd, err = open()
			return err
		})
		ch <- fd
	}()
	err := <-errc
	fd := <-ch
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, err
	}
	return fd, nil
}

// dump sends one inet_diag request for the listening TCP sockets of fam
// and calls fn for each answer until the kernel's NLMSG_DONE.
func dump(ctx context.Context, fd int, fam uint8, fn func(Listener) error) error {
	req := make([]byte, unix.SizeofNlMsghdr+sizeofReqV2)
	seq := uint32(time.Now().UnixNano())
	binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
	binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
	binary.NativeEndian.PutUint32(req[8:], seq)
	b := req[unix.SizeofNlMsghdr:]
	b[0], b[1] = fam, unix.IPPROTO_TCP
	binary.NativeEndian.PutUint32(b[4:], 1<<tcpListen)
	if err := setTimeout(ctx, fd); err != nil {
		return err
	}
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("sending the request: %w", err)
	}
	buf := make([]byte, recvBufferBytes)
	for {
		if err := setTimeout(ctx, fd); err != nil {
			return err
		}
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return fmt.Errorf("no answer from the kernel in time: %w", context.DeadlineExceeded)
		}
		if err != nil {
			return fmt.Errorf("receiving: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("parsing the answer: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != seq {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
						return fmt.Errorf("the kernel refused the request: %w", unix.Errno(-errno))
					}
				}
				return nil
			case unix.SOCK_DIAG_BY_FAMILY:
				l, err := parseMsg(m.Data)
				if err != nil {
					return err
				}
				if err := fn(l); err != nil {
					return err
				}
			}
		}
	}
}

// setTimeout bounds the next send or receive by ctx's deadline.
func setTimeout(ctx context.Context, fd int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dl, _ := ctx.Deadline()
	left := time.Until(dl)
	if left <= 0 {
		return context.DeadlineExceeded
	}
	tv := unix.NsecToTimeval(left.Nanoseconds())
	if tv.Sec == 0 && tv.Usec == 0 {
		tv.Usec = 1
	}
	for _, opt := range []int{unix.SO_RCVTIMEO, unix.SO_SNDTIMEO} {
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, opt, &tv); err != nil {
			return fmt.Errorf("setting the socket's timeout: %w", err)
		}
	}
	return nil
}

// parseMsg decodes one struct inet_diag_msg and its attributes.
func parseMsg(b []byte) (Listener, error) {
	if len(b) < sizeofInetMsg {
		return Listener{}, fmt.Errorf("inet_diag_msg of %d bytes, want at least %d", len(b), sizeofInetMsg)
	}
	var l Listener
	port := binary.BigEndian.Uint16(b[4:6])
	switch b[0] {
	case unix.AF_INET:
		a, _ := netip.AddrFromSlice(b[8:12])
		l.Addr = netip.AddrPortFrom(a, port)
	case unix.AF_INET6:
		a, _ := netip.AddrFromSlice(b[8:24])
		l.Addr = netip.AddrPortFrom(a, port)
	default:
		return Listener{}, fmt.Errorf("inet_diag_msg of address family %d", b[0])
	}
	l.UID = binary.NativeEndian.Uint32(b[64:68])
	l.Inode = uint64(binary.NativeEndian.Uint32(b[68:72]))
	for a := b[sizeofInetMsg:]; len(a) >= unix.SizeofRtAttr; {
		alen := int(binary.NativeEndian.Uint16(a[0:2]))
		typ := binary.NativeEndian.Uint16(a[2:4]) & 0x3fff // without NLA_F_NESTED/NET_BYTEORDER
		if alen < unix.SizeofRtAttr || alen > len(a) {
			return Listener{}, fmt.Errorf("attribute of length %d in %d bytes", alen, len(a))
		}
		if typ == inetDiagCgroup && alen-unix.SizeofRtAttr == 8 {
			l.CgroupID = binary.NativeEndian.Uint64(a[unix.SizeofRtAttr:alen])
			l.HasCgroupID = true
		}
		next := (alen + unix.RTA_ALIGNTO - 1) &^ (unix.RTA_ALIGNTO - 1)
		if next > len(a) {
			break
		}
		a = a[next:]
	}
	return l, nil
}
