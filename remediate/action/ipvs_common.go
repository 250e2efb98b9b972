package action

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
	"k8s.io/utils/clock"
)

// Shared pieces of the IPVS actions (setipvstimeouts.go,
// deleteipvs*.go).

// ipvsEvString reads a string from a finding's evidence.
func ipvsEvString(ev map[string]any, k string) (string, error) {
	v, ok := ev[k]
	if !ok {
		return "", fmt.Errorf("finding has no %q evidence", k)
	}
	s, ok := v.(string)
	if !ok || s == "" {
		return "", fmt.Errorf("evidence %q = %v is not a non-empty string", k, v)
	}
	return s, nil
}

// ipvsEvInt reads an integer from a finding's evidence, accepting what a
// JSON round trip (the journal) may have turned it into.
func ipvsEvInt(ev map[string]any, k string) (int, error) {
	v, ok := ev[k]
	if !ok {
		return 0, fmt.Errorf("finding has no %q evidence", k)
	}
	switch x := v.(type) {
	case int:
		return x, nil
	case int32:
		return int(x), nil
	case int64:
		return int(x), nil
	case uint16:
		return int(x), nil
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<31 {
			return int(x), nil
		}
	case json.Number:
		if i, err := x.Int64(); err == nil {
			return int(i), nil
		}
	case string:
		if i, err := strconv.Atoi(x); err == nil {
			return i, nil
		}
	}
	return 0, fmt.Errorf("evidence %q = %v (%T) is not an integer", k, v, v)
}

func ipvsEvPort(ev map[string]any, k string) (uint16, error) {
	p, err := ipvsEvInt(ev, k)
	if err != nil {
		return 0, err
	}
	if p < 1 || p > 65535 {
		return 0, fmt.Errorf("evidence %q = %d is not a port", k, p)
	}
	return uint16(p), nil
}

// ipvsVSFromEvidence reads the virtual server (vsProtocol, vsAddress,
// vsPort) a finding is about.
func ipvsVSFromEvidence(ev map[string]any) (ipvs.VirtualServer, error) {
	proto, err := ipvsEvString(ev, "vsProtocol")
	if err != nil {
		return ipvs.VirtualServer{}, err
	}
	if proto != ipvs.TCP && proto != ipvs.UDP && proto != ipvs.SCTP {
		return ipvs.VirtualServer{}, fmt.Errorf("evidence vsProtocol %q is not TCP, UDP or SCTP", proto)
	}
	as, err := ipvsEvString(ev, "vsAddress")
	if err != nil {
		return ipvs.VirtualServer{}, err
	}
	addr, err := netip.ParseAddr(as)
	if err != nil {
		return ipvs.VirtualServer{}, fmt.Errorf("evidence vsAddress: %w", err)
	}
	port, err := ipvsEvPort(ev, "vsPort")
	if err != nil {
		return ipvs.VirtualServer{}, err
	}
	return ipvs.VirtualServer{Address: addr.Unmap(), Protocol: proto, Port: port}, nil
}

// ipvsRSFromEvidence reads the real server (rsAddress, rsPort).
func ipvsRSFromEvidence(ev map[string]any) (ipvs.RealServer, error) {
	as, err := ipvsEvString(ev, "rsAddress")
	if err != nil {
		return ipvs.RealServer{}, err
	}
	addr, err := netip.ParseAddr(as)
	if err != nil {
		return ipvs.RealServer{}, fmt.Errorf("evidence rsAddress: %w", err)
	}
	port, err := ipvsEvPort(ev, "rsPort")
	if err != nil {
		return ipvs.RealServer{}, err
	}
	return ipvs.RealServer{Address: addr.Unmap(), Port: port}, nil
}

// ipvsSkipOrErr turns ErrUnavailable into a skip ("IPVS unavailable: ...")
// and wraps other errors: an unavailable kernel is never a success.
func ipvsSkipOrErr(op string, err error) error {
	if errors.Is(err, ipvs.ErrUnavailable) {
		return detect.Skip("%s", err.Error())
	}
	return fmt.Errorf("%s: %w", op, err)
}

func ipvsClock(n *node.Node) clock.PassiveClock {
	if n.Clock != nil {
		return n.Clock
	}
	return clock.RealClock{}
}

// ipvsViewGate refuses (with a skip and its reason) unless the cluster view
// is synced and connected. Deleting kernel state on a stale view would
// delete what the cluster still wants. The age of the last event is not a
// staleness signal: the view's informers have no periodic resync, so a
// quiet cluster sends no events while its watch is perfectly current.
func ipvsViewGate(n *node.Node) error {
	if n.Cluster == nil {
		return detect.Skip("%s", n.Why("kubernetes"))
	}
	f := n.Cluster.Freshness()
	switch {
	case !f.Synced:
		return detect.Skip("cluster view not synced: refusing to delete IPVS state")
	case !f.Connected:
		reason := "cluster view disconnected"
		if f.LastError != nil {
			reason += " (" + f.LastError.Error() + ")"
		}
		return detect.Skip("%s: refusing to delete IPVS state", reason)
	}
	return nil
}

// ipvsWindowLimiter allows at most max deletions in any window (one
// detection cycle, by default): a burst of findings cannot turn into a
// mass deletion.
type ipvsWindowLimiter struct {
	mu     sync.Mutex
	max    int
	window time.Duration
	times  []time.Time
}

// take records one deletion at now, or refuses when max were taken within
// window before now.
func (l *ipvsWindowLimiter) take(now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	kept := l.times[:0]
	for _, t := range l.times {
		if now.Sub(t) < l.window {
			kept = append(kept, t)
		}
	}
	l.times = kept
	if len(l.times) >= l.max {
		return detect.Skip("already deleted %d IPVS objects within %s (maxPerCycle %d): leaving the rest for later cycles",
			len(l.times), l.window, l.max)
	}
	l.times = append(l.times, now)
	return nil
}

// wouldAllow is take without recording (for Plan).
func (l *ipvsWindowLimiter) wouldAllow(now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, t := range l.times {
		if now.Sub(t) < l.window {
			n++
		}
	}
	if n >= l.max {
		return detect.Skip("already deleted %d IPVS objects within %s (maxPerCycle %d)", n, l.window, l.max)
	}
	return nil
}

// IPVSDeleteBounds are the bounds shared by the IPVS delete actions.
type IPVSDeleteBounds struct {
	// MaxPerCycle is how many objects this rule's action may delete within
	// CycleWindow (default 1).
	MaxPerCycle int `yaml:"maxPerCycle"`
	// CycleWindow is the window MaxPerCycle counts over (default 1m; set
	// it to the policy's interval for "per cycle").
	CycleWindow policy.Duration `yaml:"cycleWindow"`
}

func defaultIPVSDeleteBounds() IPVSDeleteBounds {
	return IPVSDeleteBounds{MaxPerCycle: 1, CycleWindow: policy.D(time.Minute)}
}

func (b IPVSDeleteBounds) validate() []policy.FieldError {
	var errs []policy.FieldError
	if b.MaxPerCycle < 1 || b.MaxPerCycle > 100 {
		errs = append(errs, policy.FieldError{Field: "maxPerCycle", Msg: "must be between 1 and 100"})
	}
	if b.CycleWindow.Duration <= 0 {
		errs = append(errs, policy.FieldError{Field: "cycleWindow", Msg: "must be positive"})
	}
	return errs
}

// ipvsadmFlag is ipvsadm's service-type flag for a protocol.
func ipvsadmFlag(proto string) string {
	switch proto {
	case ipvs.UDP:
		return "-u"
	case ipvs.SCTP:
		return "--sctp-service"
	}
	return "-t"
}
