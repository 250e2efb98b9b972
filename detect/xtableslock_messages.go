package detect

import (
	"context"
	"fmt"
	"time"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// XtablesLockMessagesParams are the thresholds of XtablesLockMessages.
type XtablesLockMessagesParams struct {
	// Window over which the lock messages are counted (default 5m, at
	// least 1m).
	Window policy.Duration `yaml:"window"`
	// MaxPerMinute: a warning when a container's log has more lock
	// messages a minute than this over the window (default 1: field
	// guide 3's troubleshooting step 2 calls more than one a minute
	// significant contention between kube-proxy and another iptables
	// user).
	MaxPerMinute float64 `yaml:"maxPerMinute"`
}

// SetDefaults implements registry.Defaulter.
func (p *XtablesLockMessagesParams) SetDefaults() {
	*p = XtablesLockMessagesParams{Window: policy.D(logWindowMin), MaxPerMinute: causes.LockLinesPerMinute}
}

// Validate implements policy.Validator.
func (p *XtablesLockMessagesParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Window.Duration < time.Minute || p.Window.Duration > time.Hour {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must be between 1m and 1h"})
	}
	if p.MaxPerMinute <= 0 || p.MaxPerMinute > 1000 {
		errs = append(errs, policy.FieldError{Field: "maxPerMinute", Msg: "must be more than 0 and at most 1000"})
	}
	return errs
}

func init() {
	Define("XtablesLockMessages",
		"kube-proxy's or a CNI agent's container log says it waited for the xtables lock more often than maxPerMinute over a window",
		func(p *XtablesLockMessagesParams, n *node.Node) (Detector, error) {
			return &xtablesLockMessages{p: *p, n: n}, nil
		}, Targets(finding.KindKubeProxy, finding.KindNodeAgent))
}

type xtablesLockMessages struct {
	p XtablesLockMessagesParams
	n *node.Node
	judgement
}

func (d *xtablesLockMessages) Detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.PodLogs == nil {
		return nil, finding.Skip("%s", d.n.Why("podlogs"))
	}
	srcs, why := logSources(ctx, d.n)
	if len(srcs) == 0 {
		return nil, finding.Skip("no kube-proxy or CNI agent pod on this node to read the log of: %v", why)
	}
	win := d.p.Window.Duration
	lines, why2 := logLines(ctx, d.n, srcs, win)
	why = append(why, why2...)
	var out []finding.Finding
	worst := 0.0
	for _, l := range lines {
		if l.Class != causes.ClassXtablesLock {
			continue
		}
		perMin := float64(l.Count) / win.Minutes()
		worst = max(worst, perMin)
		if perMin <= d.p.MaxPerMinute {
			continue
		}
		out = append(out, d.finding(srcs, l, perMin))
	}
	judged := fmt.Sprintf("at most %.2g xtables lock messages a minute in %d container logs over the last %s (limit %.2g)", worst, len(srcs), win, d.p.MaxPerMinute)
	if len(why) > 0 {
		judged += fmt.Sprintf("; not read: %v", why)
	}
	d.set("%s", judged)
	return out, nil
}

// finding is the warning for one container's lock messages.
func (d *xtablesLockMessages) finding(srcs []logSource, l causes.LogLine, perMin float64) finding.Finding {
	target := "kube-proxy"
	for _, s := range srcs {
		if s.String() == l.Source {
			target = s.target
		}
	}
	return finding.Finding{
		Detector: "XtablesLockMessages",
		Target:   target,
		Severity: finding.Warning,
		Message: fmt.Sprintf("%s logged %d xtables lock messages in the last %s (%.2g a minute, limit %.2g: significant lock contention with another iptables user); newest: \"%s\"",
			l.Source, l.Count, l.Window, perMin, d.p.MaxPerMinute, l.Quote),
		Evidence: map[string]any{
			"source":        l.Source,
			"lines":         l.Count,
			"perMinute":     perMin,
			"maxPerMinute":  d.p.MaxPerMinute,
			"windowSeconds": l.Window.Seconds(),
			"quote":         l.Quote,
			"last":          l.Last,
		},
	}
}
