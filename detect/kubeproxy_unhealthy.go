package detect

import (
	"context"
	"fmt"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
)

// KubeProxyUnhealthyParams has no thresholds: kube-proxy itself decides
// (unhealthy when a queued sync is older than 2 x syncPeriod).
type KubeProxyUnhealthyParams struct{}

func init() {
	Define("KubeProxyUnhealthy",
		"kube-proxy's /healthz reports it unhealthy (per IP family from 1.33; a node being deleted is not a fault)",
		newKubeProxyUnhealthy, Targets(finding.KindKubeProxy))
}

type kubeProxyUnhealthy struct {
	n *node.Node
	judgement
}

func newKubeProxyUnhealthy(_ *KubeProxyUnhealthyParams, n *node.Node) (Detector, error) {
	return &kubeProxyUnhealthy{n: n}, nil
}

func (d *kubeProxyUnhealthy) Detect(ctx context.Context) ([]finding.Finding, error) {
	kp, err := kubeProxyOf(d.n)
	if err != nil {
		return nil, err
	}
	h, err := kp.Healthz(ctx)
	if err != nil {
		return nil, kubeProxyReadError("/healthz", err)
	}
	d.set("/healthz healthy (%d families reported)", len(h.Families))
	return unhealthyFindings(h), nil
}

// unhealthyFindings is the decision: one finding per family /healthz names
// unhealthy (or one for kube-proxy as a whole before 1.33).
func unhealthyFindings(h *kubeproxy.Healthz) []finding.Finding {
	var out []finding.Finding
	for _, f := range h.UnhealthyFamilies() {
		ev := map[string]any{
			"statusCode":  h.StatusCode,
			"format":      h.Format,
			"lastUpdated": rfc3339(h.LastUpdated),
			"currentTime": rfc3339(h.CurrentTime),
		}
		since := h.LastUpdated
		if f != kubeproxy.Unlabelled {
			ev["ipFamily"] = string(f)
			since = h.Families[f].LastUpdated
			ev["familyLastUpdated"] = rfc3339(since)
		}
		msg := fmt.Sprintf("kube-proxy /healthz answers %d: %s unhealthy", h.StatusCode, f)
		if !since.IsZero() {
			msg += fmt.Sprintf(", rules last updated %s before kube-proxy's current time", h.CurrentTime.Sub(since).Round(1e9))
		}
		out = append(out, finding.Finding{
			Detector: "KubeProxyUnhealthy",
			Target:   f.Target(),
			Severity: finding.Critical,
			Message:  msg,
			Evidence: ev,
		})
	}
	return out
}
