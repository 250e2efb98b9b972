package cni

import (
	"regexp"
	"sort"
	"strings"
	"unicode"

	"github.com/remediate-dev/remediate/internal/clip"
)

// FailureKind classifies why a pod sandbox could not be created or torn
// down, from the CNI error text the kubelet puts in its
// FailedCreatePodSandBox and FailedKillPod Events.
type FailureKind string

// The kinds, with the upstream text each is recognised by (the sources are
// cited in testdata/sandbox_failures.txt).
const (
	// FailureIPAMExhausted: host-local's "no IP addresses available in
	// range set" (containernetworking/plugins allocator.go), the AWS VPC
	// CNI's "failed to assign an IP address to container".
	FailureIPAMExhausted FailureKind = "IPAMExhausted"
	// FailurePluginMissing: libcni's "failed to find plugin %q in path".
	FailurePluginMissing FailureKind = "PluginMissing"
	// FailureConfig: no or an invalid network configuration (containerd
	// go-cni "no network config found in", "cni plugin not initialized",
	// "cni config load failed", "invalid cni config").
	FailureConfig FailureKind = "ConfigInvalid"
	// FailureAgentUnreachable: the plugin cannot reach its node agent:
	// Calico's nodename file ("check that the calico/node container is
	// running"), Cilium's socket ("unable to connect to Cilium daemon",
	// "Cilium API client timeout exceeded"), aws-node's ipamd gRPC
	// ("Error received from AddNetwork gRPC call", 127.0.0.1:50051).
	FailureAgentUnreachable FailureKind = "AgentUnreachable"
	// FailureXtablesLock: iptables' "Another app is currently holding the
	// xtables lock" (portmap, bandwidth and the agents' plugins run
	// iptables).
	FailureXtablesLock FailureKind = "XtablesLock"
	// FailureUnknown: none of the above.
	FailureUnknown FailureKind = "Unknown"
)

// failurePatterns are matched in order, case-insensitively, on the whole
// message: the first kind with a matching substring wins. The lock comes
// first (it is the cause when an agent's or portmap's iptables call fails),
// then the allocator, the plugin lookup, the configuration, the agents.
var failurePatterns = []struct {
	kind FailureKind
	subs []string
}{
	{FailureXtablesLock, []string{"another app is currently holding the xtables lock"}},
	{FailureIPAMExhausted, []string{"no ip addresses available in range set", "failed to assign an ip address to container"}},
	{FailurePluginMissing, []string{"failed to find plugin"}},
	{FailureConfig, []string{"no network config found in", "cni plugin not initialized", "cni config uninitialized",
		"cni config load failed", "invalid cni config", "failed to load cni config", "no net configurations found"}},
	{FailureAgentUnreachable, []string{"check that the calico/node container is running", "unable to connect to cilium daemon",
		"cilium api client timeout exceeded", "/var/run/cilium/cilium.sock", "error received from addnetwork grpc call",
		"error received from delnetwork grpc call", "127.0.0.1:50051"}},
}

// ClassifyFailure returns the kind of a sandbox failure message. It is a
// pure function of the text.
func ClassifyFailure(msg string) FailureKind {
	l := strings.ToLower(msg)
	for _, p := range failurePatterns {
		for _, s := range p.subs {
			if strings.Contains(l, s) {
				return p.kind
			}
		}
	}
	return FailureUnknown
}

// MaxFailureMessage bounds a sanitised message: at most this many bytes
// plus clip's marker (under 32 bytes).
const MaxFailureMessage = 256

// maxFailureInput bounds the text looked at (an Event message is at most
// 1 KiB by the apiserver's validation; a hostile source is cut here).
const maxFailureInput = 8 << 10

// boilerplate is the wrapping the kubelet and the CRI add before the CNI
// error; it is dropped so that the clipped message keeps the cause.
var boilerplate = []string{"Failed to create pod sandbox: ", "error killing pod: ", "rpc error: code = Unknown desc = "}

// longID is a container or sandbox ID (64 hex digits): shortened to 12, as
// crictl prints them.
var longID = regexp.MustCompile(`[0-9a-f]{64}`)

// SanitizeFailure makes an Event message safe and short to carry in a
// finding: the kubelet's and CRI's wrapping is dropped, 64-digit IDs are
// shortened to 12, control characters (newlines included) become spaces,
// runs of spaces one, and the result is clipped to MaxFailureMessage bytes
// of valid UTF-8 (plus clip's marker).
func SanitizeFailure(msg string) string {
	if len(msg) > maxFailureInput {
		msg = msg[:maxFailureInput]
	}
	for _, b := range boilerplate {
		msg = strings.Replace(msg, b, "", 1)
	}
	msg = longID.ReplaceAllStringFunc(msg, func(id string) string { return id[:12] })
	var b strings.Builder
	space := false
	for _, r := range strings.ToValidUTF8(msg, "?") {
		if unicode.IsControl(r) || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			if !space && b.Len() > 0 {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		space = false
		b.WriteRune(r)
	}
	return clip.String(strings.TrimSpace(b.String()), MaxFailureMessage)
}

// FailureCount is how many failures of one kind were seen, with one
// example message (sanitised) of that kind: the most recent.
type FailureCount struct {
	Kind    FailureKind `json:"kind"`
	Count   int         `json:"count"`
	Example string      `json:"message"`
}

// FailureTally counts classified failures. The zero value is ready.
type FailureTally struct {
	byKind map[FailureKind]*FailureCount
	newest map[FailureKind]int64
}

// Add counts n failures (n < 1 counts as 1) with message msg, last seen at
// unix second at (the most recent message is the kind's example).
func (t *FailureTally) Add(msg string, n int, at int64) FailureKind {
	if t.byKind == nil {
		t.byKind, t.newest = map[FailureKind]*FailureCount{}, map[FailureKind]int64{}
	}
	if n < 1 {
		n = 1
	}
	k := ClassifyFailure(msg)
	c := t.byKind[k]
	if c == nil {
		c = &FailureCount{Kind: k}
		t.byKind[k] = c
	}
	if c.Count+n > c.Count {
		c.Count += n
	}
	if c.Example == "" || at >= t.newest[k] {
		c.Example, t.newest[k] = SanitizeFailure(msg), at
	}
	return k
}

// Counts returns the kinds by count, highest first (ties: known kinds
// before Unknown, then by name).
func (t *FailureTally) Counts() []FailureCount {
	out := make([]FailureCount, 0, len(t.byKind))
	for _, c := range t.byKind {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		if (out[i].Kind == FailureUnknown) != (out[j].Kind == FailureUnknown) {
			return out[j].Kind == FailureUnknown
		}
		return out[i].Kind < out[j].Kind
	})
	return out
}

// Top returns the most frequent kind, preferring a known kind to Unknown
// when any known kind was seen (an unknown text says nothing about the
// cause). ok is false when nothing was counted.
func (t *FailureTally) Top() (FailureCount, bool) {
	cs := t.Counts()
	if len(cs) == 0 {
		return FailureCount{}, false
	}
	for _, c := range cs {
		if c.Kind != FailureUnknown {
			return c, true
		}
	}
	return cs[0], true
}
