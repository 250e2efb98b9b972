package action

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
	"k8s.io/utils/clock"
)

// Shared pieces of the IPVS actions (setipvstimeouts.go,
// deleteipvs*.go).

// ipvsSkipOrErr turns ErrUnavailable into a skip ("IPVS unavailable: ...")
// and wraps other errors: an unavailable kernel is never a success.
func ipvsSkipOrErr(op string, err error) error {
	if errors.Is(err, ipvs.ErrUnavailable) {
		return finding.Skip("%s", err.Error())
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
		return finding.Skip("%s", n.Why("kubernetes"))
	}
	f := n.Cluster.Freshness()
	switch {
	case !f.Synced:
		return finding.Skip("cluster view not synced: refusing to delete IPVS state")
	case f.OverBudget != "":
		return finding.Skip("%s: refusing to delete IPVS state", f.OverBudget)
	case !f.Connected:
		reason := "cluster view disconnected"
		if f.LastError != nil {
			reason += " (" + f.LastError.Error() + ")"
		}
		return finding.Skip("%s: refusing to delete IPVS state", reason)
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
		return finding.Skip("already deleted %d IPVS objects within %s (maxPerCycle %d): leaving the rest for later cycles",
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
		return finding.Skip("already deleted %d IPVS objects within %s (maxPerCycle %d)", n, l.window, l.max)
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
