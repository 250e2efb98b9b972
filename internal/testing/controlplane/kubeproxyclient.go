package controlplane

import (
	"net/http"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// Client returns the daemon's kube-proxy adapter for kp: o with kp's
// metrics, healthz and proxyMode URLs, reached through the control plane's
// namespace (the test process is in the host's; keep-alives off, so no
// connection outlives a kube-proxy restart). o's SyncPeriod, Timeout and
// CacheTTL are the caller's; its URLs and Transport are replaced.
func (kp *KubeProxy) Client(o kubeproxy.Options) *kubeproxy.Client {
	kp.cp.t.Helper()
	o.MetricsURL, o.HealthzURL, o.ProxyModeURL = kp.MetricsURL, kp.HealthzURL, kp.ProxyModeURL
	o.Transport = &http.Transport{DialContext: kp.cp.NetNS.DialContext, DisableKeepAlives: true}
	c, err := kubeproxy.New(o)
	if err != nil {
		kp.cp.t.Fatalf("kube-proxy client for %s: %v", kp.NodeName, err)
	}
	return c
}
