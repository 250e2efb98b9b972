package detect

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

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
	_, err := findKubeProxy(ctx, n)
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
