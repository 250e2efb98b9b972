package conntrack

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Sysctl keys of the timeouts TimeoutTuner reads and writes. They are per
// network namespace (unlike nf_conntrack_max): the daemon, on the host
// network, changes the host's.
const (
	UDPTimeoutKey         = "net.netfilter.nf_conntrack_udp_timeout"
	UDPTimeoutStreamKey   = "net.netfilter.nf_conntrack_udp_timeout_stream"
	TCPTimeoutTimeWaitKey = "net.netfilter.nf_conntrack_tcp_timeout_time_wait"
)

// Timeouts are conntrack timeouts (whole seconds). In a change, a zero
// field means "leave as is".
type Timeouts struct {
	// UDP is nf_conntrack_udp_timeout: an entry that saw no reply.
	UDP time.Duration `json:"udp"`
	// UDPStream is nf_conntrack_udp_timeout_stream: a UDP entry with
	// packets both ways (kernel default 120 s since 6.0, 180 s before).
	UDPStream time.Duration `json:"udpStream"`
	// TCPTimeWait is nf_conntrack_tcp_timeout_time_wait (default 120 s).
	TCPTimeWait time.Duration `json:"tcpTimeWait"`
}

// RestoreCommand is the sysctl(8) command that sets the non-zero fields of
// t (run in the namespace the values were read in).
func (t Timeouts) RestoreCommand() string {
	var kv []string
	for _, e := range []struct {
		key string
		d   time.Duration
	}{{UDPTimeoutKey, t.UDP}, {UDPTimeoutStreamKey, t.UDPStream}, {TCPTimeoutTimeWaitKey, t.TCPTimeWait}} {
		if e.d > 0 {
			kv = append(kv, fmt.Sprintf("%s=%d", e.key, int64(e.d/time.Second)))
		}
	}
	if len(kv) == 0 {
		return ""
	}
	return "sysctl -w " + strings.Join(kv, " ")
}

// TimeoutTuner is implemented by adapters that can read and set the
// timeouts of the observed namespace (the real adapter and the fake).
type TimeoutTuner interface {
	// Timeouts reads the current timeouts.
	Timeouts(ctx context.Context) (Timeouts, error)
	// SetTimeouts writes the non-zero fields (whole seconds).
	SetTimeouts(ctx context.Context, t Timeouts) error
}
