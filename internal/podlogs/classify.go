package podlogs

import (
	"regexp"
	"strings"

	"github.com/remediate-dev/remediate/internal/bundle"
	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/termsafe"
)

// Kind is what a classified line says went wrong.
type Kind string

// The kinds of line.
const (
	// MissingMatch: iptables-restore could not load a match extension
	// ("Couldn't load match `nfacct'", kubernetes/kubernetes#142068): the
	// kernel or the iptables build in kube-proxy's image lacks it.
	MissingMatch Kind = "missing-match"
	// MissingTarget: a target extension could not be loaded ("Couldn't
	// load target `REJECT'", k3s-io/k3s#10099).
	MissingTarget Kind = "missing-target"
	// MissingChain: the restore jumps to a chain that is not there
	// ("Couldn't load target `KUBE-SVC-...'", projectcalico/calico#10538:
	// another agent deleted or flushed kube-proxy's chain).
	MissingChain Kind = "missing-chain"
	// XtablesLock: iptables waited for, or gave up on, the xtables lock
	// ("Another app is currently holding the xtables lock").
	XtablesLock Kind = "xtables-lock"
	// PermissionDenied: a netfilter or file operation was refused
	// (missing CAP_NET_ADMIN, a read-only /run/xtables.lock, SELinux).
	PermissionDenied Kind = "permission-denied"
	// APIRefused: the API server's address refused or timed out the
	// connection (kube-proxy cannot list Services or EndpointSlices).
	APIRefused Kind = "api-unreachable"
	// APIUnauthorized: the API server refused kube-proxy's credentials.
	APIUnauthorized Kind = "api-unauthorized"
	// APIForbidden: RBAC refused a list or watch.
	APIForbidden Kind = "api-forbidden"
)

// Class is a classified line.
type Class struct {
	Kind Kind
	// Object is the match, target or chain named (MissingMatch,
	// MissingTarget, MissingChain); "" otherwise.
	Object string
}

// loadRE is iptables' "Couldn't load match `x'" / "Couldn't load target
// `x'" (the name is quoted `x' by iptables, 'x' or "x" by some builds).
var loadRE = regexp.MustCompile("(?i)couldn'?t load (match|target) [`'\"]([^`'\"\\s:]{1,64})['\"`]")

// apiWords are what makes a refused connection, Unauthorized or Forbidden
// an API error, not a kernel or file one.
var apiWords = []string{"failed to list", "failed to watch", "watch of", "/api/v1", "/apis/", "reflector", "apiserver", "api server", "listing"}

// Classify says what a line says went wrong; ok is false for a line of
// no known kind. It is a pure function of the line's text.
func Classify(text string) (Class, bool) {
	if m := loadRE.FindStringSubmatch(text); m != nil {
		name := m[2]
		if strings.EqualFold(m[1], "match") {
			return Class{Kind: MissingMatch, Object: name}, true
		}
		if isChain(name) {
			return Class{Kind: MissingChain, Object: name}, true
		}
		return Class{Kind: MissingTarget, Object: name}, true
	}
	lower := strings.ToLower(text)
	if strings.Contains(lower, "holding the xtables lock") || strings.Contains(lower, "another app is currently holding") {
		return Class{Kind: XtablesLock}, true
	}
	api := false
	for _, w := range apiWords {
		if strings.Contains(lower, w) {
			api = true
			break
		}
	}
	switch {
	case api && (strings.Contains(lower, "connection refused") || strings.Contains(lower, "i/o timeout") || strings.Contains(lower, "no route to host")):
		return Class{Kind: APIRefused}, true
	case api && strings.Contains(lower, "unauthorized"):
		return Class{Kind: APIUnauthorized}, true
	case strings.Contains(lower, "is forbidden") && strings.Contains(lower, "cannot "):
		return Class{Kind: APIForbidden}, true
	case strings.Contains(lower, "permission denied") && netfilterWord(lower):
		return Class{Kind: PermissionDenied}, true
	}
	return Class{}, false
}

// netfilterWords make a "permission denied" one of netfilter's (not, say,
// kube-proxy's "Failed to apply OOMScore ... permission denied", which the
// real kube-proxy logs at start-up in an unprivileged container).
var netfilterWords = []string{"iptables", "ip6tables", "xtables", "nft", "netfilter", "netlink", "you must be root", "conntrack", "ipvs"}

func netfilterWord(lower string) bool {
	for _, w := range netfilterWords {
		if strings.Contains(lower, w) {
			return true
		}
	}
	return false
}

// isChain tells a user-defined chain from a target extension: extensions
// are spelled in capitals and digits (REJECT, MASQUERADE, CONNMARK, DNAT);
// chains carry a dash or lower case (KUBE-SVC-..., CNI-..., cali-...).
func isChain(name string) bool {
	for _, r := range name {
		if !(r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return true
		}
	}
	return false
}

// maxQuote bounds a quoted line.
const maxQuote = 300

// Quote is a line as findings quote it: secrets redacted as in the
// support bundle (internal/bundle), clipped, and escaped for a terminal
// (internal/termsafe) on one line.
func Quote(text string) string {
	r, _ := bundle.RedactString(strings.TrimSpace(text))
	return termsafe.Line(clip.String(r, maxQuote))
}
