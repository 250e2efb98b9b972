package causes

import (
	"fmt"
	"time"
)

// The kinds of cause read from kube-proxy's and the CNI agents' container
// logs (internal/podlogs classifies the lines; the detectors count them
// and check a missing extension against the kernel).
const (
	// LogMissingExtension: iptables-restore could not load a match or
	// target extension it needs ("Couldn't load match `nfacct'"): every
	// restore fails, kube-proxy's rules stay as they were.
	LogMissingExtension Kind = "log-missing-extension"
	// LogMissingChain: a restore jumps to a chain that is not there
	// ("Couldn't load target `KUBE-SVC-...'"): another agent removed it.
	LogMissingChain Kind = "log-missing-chain"
	// LogXtablesLock: iptables reported waiting for, or giving up on, the
	// xtables lock ("Another app is currently holding the xtables lock").
	LogXtablesLock Kind = "log-xtables-lock"
	// LogPermissionDenied: a netfilter or file operation was refused.
	LogPermissionDenied Kind = "log-permission-denied"
	// LogAPIError: listing or watching the API failed (refused,
	// Unauthorized, Forbidden): kube-proxy does not see Service changes.
	LogAPIError Kind = "log-api-error"
)

// LockLinesPerMinute is the rate of xtables lock messages in a log above
// which the node has significant lock contention: field guide 3's
// troubleshooting step 2 gives "more than once per minute".
const LockLinesPerMinute = 1.0

// Log line classes as internal/podlogs names them (LogLine.Class).
const (
	ClassMissingMatch    = "missing-match"
	ClassMissingTarget   = "missing-target"
	ClassMissingChain    = "missing-chain"
	ClassXtablesLock     = "xtables-lock"
	ClassPermission      = "permission-denied"
	ClassAPIRefused      = "api-unreachable"
	ClassAPIUnauthorized = "api-unauthorized"
	ClassAPIForbidden    = "api-forbidden"
)

// LogLine is one kind of classified line seen in a container's log over a
// window: how many, and the newest quoted.
type LogLine struct {
	// Source names the container ("kube-proxy pod kube-system/kube-proxy-x
	// container kube-proxy").
	Source string `json:"source"`
	// Class is the line's class (internal/podlogs.Kind).
	Class string `json:"class"`
	// Object is the match, target or chain named, if any.
	Object string `json:"object,omitempty"`
	// Quote is the newest such line: secrets redacted, clipped, escaped
	// for a terminal.
	Quote string `json:"quote"`
	// Count is how many such lines the window holds; Last the newest's
	// time.
	Count  int           `json:"count"`
	Last   time.Time     `json:"last"`
	Window time.Duration `json:"window"`
	// Kernel is, for a missing match or target, what the kernel says of
	// the module providing it ("xt_nfacct: missing"; "" not checked);
	// KernelLacks is set when the kernel is known to lack it.
	Kernel      string `json:"kernel,omitempty"`
	KernelLacks bool   `json:"kernelLacks,omitempty"`
}

// Scores of the log causes. A line naming why a restore failed is direct
// evidence: above any threshold-judged figure at its threshold (1), more
// so when the kernel confirms it.
const (
	scoreNamed        = 2.0
	scoreKernelLacks  = 5.0
	scoreLogAPIOrPerm = 1.5
)

// logCause is the cause a LogLine says.
func logCause(l LogLine) Cause {
	perMin := 0.0
	if l.Window > 0 {
		perMin = float64(l.Count) / l.Window.Minutes()
	}
	figs := []Figure{{"lines", float64(l.Count), ""}, {"windowSeconds", l.Window.Seconds(), "s"}}
	seen := fmt.Sprintf("%d× in the last %s in %s, newest: \"%s\"", l.Count, dur(l.Window), l.Source, l.Quote)
	switch l.Class {
	case ClassMissingMatch, ClassMissingTarget:
		what := "match"
		if l.Class == ClassMissingTarget {
			what = "target"
		}
		score, kernel := scoreNamed, ""
		if l.Kernel != "" {
			kernel = "; kernel: " + l.Kernel
		}
		if l.KernelLacks {
			score = scoreKernelLacks
			kernel += " (the kernel lacks it: load or build the module, or run kube-proxy without it)"
		} else if l.Kernel != "" {
			kernel += " (the kernel has it: the iptables in the container's image lacks the extension)"
		}
		return Cause{Kind: LogMissingExtension, Score: score,
			Summary: fmt.Sprintf("iptables-restore cannot load %s %q%s: %s", what, l.Object, kernel, seen), Figures: figs}
	case ClassMissingChain:
		return Cause{Kind: LogMissingChain, Score: scoreNamed,
			Summary: fmt.Sprintf("a restore jumps to chain %q, which is gone (another agent deleted or flushed it): %s", l.Object, seen), Figures: figs}
	case ClassXtablesLock:
		// Any lock message in the window says why a restore failed or
		// waited, as directly as a missing extension; its rate past
		// twice field guide 3's once a minute scores higher.
		return Cause{Kind: LogXtablesLock, Score: max(scoreNamed, perMin/LockLinesPerMinute),
			Summary: fmt.Sprintf("iptables waited for the xtables lock %.2g times a minute (field guide 3: > %.0f a minute is significant contention): %s", perMin, LockLinesPerMinute, seen),
			Figures: append(figs, Figure{"linesPerMinute", perMin, "per-min"})}
	case ClassPermission:
		return Cause{Kind: LogPermissionDenied, Score: scoreLogAPIOrPerm,
			Summary: "permission denied (capabilities, a read-only lock file, an LSM): " + seen, Figures: figs}
	default:
		return Cause{Kind: LogAPIError, Score: scoreLogAPIOrPerm,
			Summary: fmt.Sprintf("API %s: %s", l.Class, seen), Figures: figs}
	}
}
