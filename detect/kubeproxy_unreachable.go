package detect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

// KubeProxyUnreachableParams has no thresholds; use the rule's `for` to
// ignore short blips (a kube-proxy restart).
type KubeProxyUnreachableParams struct{}

func init() {
	Define("KubeProxyUnreachable",
		"kube-proxy's metrics or healthz endpoint refuses, times out, or answers something malformed or oversized",
		newKubeProxyUnreachable, Targets(finding.KindKubeProxy))
}

type kubeProxyUnreachable struct {
	n *node.Node
	judgement
}

func newKubeProxyUnreachable(_ *KubeProxyUnreachableParams, n *node.Node) (Detector, error) {
	return &kubeProxyUnreachable{n: n}, nil
}

func (d *kubeProxyUnreachable) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	var out []finding.Finding
	_, merr := kp.Metrics(ctx)
	_, herr := kp.Healthz(ctx)
	if ctx.Err() != nil {
		// Our own deadline, not kube-proxy's fault: cannot tell.
		return nil, fmt.Errorf("probing kube-proxy: %w", ctx.Err())
	}
	if why := kubeProxyAbsence(ctx, d.n, merr, herr); why != "" {
		return nil, finding.Skip("%s", why)
	}
	d.set("metrics and /healthz answered")
	for _, e := range []struct {
		endpoint string
		err      error
	}{{"metrics", merr}, {"healthz", herr}} {
		if fd := unreachableFinding(e.endpoint, e.err); fd != nil {
			out = append(out, *fd)
		}
	}
	return out, nil
}

// unreachableFinding turns a failed read of one endpoint into a finding
// ("kube-proxy/metrics", "kube-proxy/healthz").
func unreachableFinding(endpoint string, err error) *finding.Finding {
	if err == nil {
		return nil
	}
	kind, url := kubeproxy.KindUnreachable, ""
	if e, ok := kubeproxy.AsError(err); ok {
		kind, url = e.Kind, e.URL
	}
	sev, what := finding.Critical, "is unreachable"
	if kind == kubeproxy.KindBadResponse {
		sev, what = finding.Warning, "answers something unusable"
	}
	return &finding.Finding{
		Detector: "KubeProxyUnreachable",
		Target:   "kube-proxy/" + endpoint,
		Severity: sev,
		Message:  fmt.Sprintf("kube-proxy %s endpoint %s: %v", endpoint, what, err),
		Evidence: map[string]any{"endpoint": endpoint, "url": url, "kind": string(kind), "error": err.Error()},
	}
}

// kubeProxyAbsence says why kube-proxy is absent from this node, or ""
// when it may be present: absent means nothing listens on either endpoint
// (both refuse connections) and no process is this node's kube-proxy
// (findKubeProxy: one named kube-proxy in another network namespace, or
// whose executable is no kube-proxy, is another's and does not count). A
// kube-proxy that runs and does not answer, answers garbage or times out
// is present (a finding), and so is one this daemon cannot look for (no
// procRoot, unreadable, several candidates).
func kubeProxyAbsence(ctx context.Context, n *node.Node, merr, herr error) string {
	if n.ProcRoot == "" || n.Procs == nil || !refused(merr) || !refused(herr) {
		return ""
	}
	_, _, err := findKubeProxy(ctx, n)
	if !errors.Is(err, errNoNodeKubeProxy) {
		return ""
	}
	var urls []string
	for _, e := range []error{merr, herr} {
		if ke, ok := kubeproxy.AsError(e); ok && ke.URL != "" {
			urls = append(urls, ke.URL)
		}
	}
	return fmt.Sprintf("kube-proxy is not running on this node (%v; nothing listening on %s)", err, strings.Join(urls, " or "))
}

func refused(err error) bool {
	return err != nil && errors.Is(err, syscall.ECONNREFUSED)
}
