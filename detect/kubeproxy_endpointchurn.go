package detect

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// This file holds two windowed detectors over kube-proxy's node-wide
// counters, each a finding of its own before anything has drifted:
// KubeProxyEndpointChurn (the rate of endpoint changes kube-proxy receives)
// and KubeProxyAPIErrors (kube-proxy's requests to the API server failing).

// KubeProxyEndpointChurnParams are the thresholds of KubeProxyEndpointChurn.
type KubeProxyEndpointChurnParams struct {
	// MaxPerSecond: a finding when kube-proxy receives more endpoint
	// changes per second than this, averaged over Window (default 10: field
	// guide 2's KubeProxyEndpointChurn alert,
	// rate(kubeproxy_sync_proxy_rules_endpoint_changes_total[5m]) > 10, a
	// per-second rate).
	MaxPerSecond float64 `yaml:"maxPerSecond"`
	// Window is how far back the rate is taken (default 5m, the guide's
	// rate window). The rate is judged once two scrapes at least 30s
	// apart are in the window.
	Window policy.Duration `yaml:"window"`
}

// SetDefaults sets the defaults of KubeProxyEndpointChurn (registry.Defaulter).
func (p *KubeProxyEndpointChurnParams) SetDefaults() {
	*p = KubeProxyEndpointChurnParams{MaxPerSecond: 10, Window: policy.D(5 * time.Minute)}
}

// Validate implements policy.Validator.
func (p *KubeProxyEndpointChurnParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if !(p.MaxPerSecond > 0) || p.MaxPerSecond > 1e6 {
		errs = append(errs, policy.FieldError{Field: "maxPerSecond", Msg: "must be in (0, 1000000]"})
	}
	if p.Window.Duration < causeWindowMin || p.Window.Duration > 24*time.Hour {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must be between 30s and 24h"})
	}
	return errs
}

// KubeProxyAPIErrorsParams are the thresholds of KubeProxyAPIErrors.
type KubeProxyAPIErrorsParams struct {
	// MaxErrors: a finding when more of kube-proxy's requests to the API
	// server than this failed within Window (default 0: any). Counted
	// from client-go's rest_client_requests_total: code 403 (its
	// credentials or RBAC refused), 429 (throttled), 5xx (the API server
	// failing) and "<error>" (no response: connection refused, timeout).
	// Field guide 1 names 5xx and 429, guide 5 adds 403: each leaves
	// kube-proxy's watches without updates, so the rules go stale.
	MaxErrors int `yaml:"maxErrors"`
	// Window is how far back the failures are counted (default 5m).
	Window policy.Duration `yaml:"window"`
}

// SetDefaults sets the defaults of KubeProxyAPIErrors (registry.Defaulter).
func (p *KubeProxyAPIErrorsParams) SetDefaults() {
	*p = KubeProxyAPIErrorsParams{MaxErrors: 0, Window: policy.D(5 * time.Minute)}
}

// Validate implements policy.Validator.
func (p *KubeProxyAPIErrorsParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.MaxErrors < 0 {
		errs = append(errs, policy.FieldError{Field: "maxErrors", Msg: "must not be negative"})
	}
	if p.Window.Duration < causeWindowMin || p.Window.Duration > 24*time.Hour {
		errs = append(errs, policy.FieldError{Field: "window", Msg: "must be between 30s and 24h"})
	}
	return errs
}

func init() {
	Define("KubeProxyEndpointChurn",
		"kube-proxy receives endpoint changes faster than a rate (sync_proxy_rules_endpoint_changes_total per second over a window; field guide 2's churn alert)",
		func(p *KubeProxyEndpointChurnParams, n *node.Node) (Detector, error) {
			return &kubeProxyChurn{p: *p, n: n}, nil
		}, Targets(finding.KindKubeProxy), Windowed())
	Define("KubeProxyAPIErrors",
		"kube-proxy's requests to the API server fail (rest_client_requests_total codes 403, 429, 5xx and no response) within a window, before anything has drifted",
		func(p *KubeProxyAPIErrorsParams, n *node.Node) (Detector, error) {
			return &kubeProxyAPIErrors{p: *p, n: n}, nil
		}, Targets(finding.KindKubeProxy), Windowed())
}

type kubeProxyChurn struct {
	p KubeProxyEndpointChurnParams
	n *node.Node

	mu sync.Mutex
	w  window[float64]
	judgement
}

func (d *kubeProxyChurn) Detect(ctx context.Context) ([]finding.Finding, error) {
	_, sc, err := kubeProxyScrape(ctx, d.n)
	if err != nil {
		return nil, err
	}
	if sc.Metrics.EndpointChangesTotal == nil {
		return nil, finding.Skip("kube-proxy does not export sync_proxy_rules_endpoint_changes_total")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	changes, covered, st := d.w.advance(sc.Seq, sc.At, *sc.Metrics.EndpointChangesTotal, d.p.Window.Duration, counterIncrease)
	if st != windowReady || covered < causeWindowMin {
		d.set("endpoint churn not judged yet: the window holds less than %s of scrapes", causeWindowMin)
		return nil, nil
	}
	fd := churnFinding(changes, covered, d.p)
	d.set("endpoint churn %.3g changes/s over %s (limit %g/s)", changes/covered.Seconds(),
		covered.Round(time.Second), d.p.MaxPerSecond)
	if fd == nil {
		return nil, nil
	}
	return []finding.Finding{*fd}, nil
}

// churnFinding is KubeProxyEndpointChurn's decision on changes received
// over covered.
func churnFinding(changes float64, covered time.Duration, p KubeProxyEndpointChurnParams) *finding.Finding {
	rate := changes / covered.Seconds()
	if !(rate > p.MaxPerSecond) {
		return nil
	}
	return &finding.Finding{
		Detector: "KubeProxyEndpointChurn",
		// The counter is node-wide (no ip_family in any version).
		Target:   "kube-proxy",
		Severity: finding.Warning,
		Message: fmt.Sprintf("kube-proxy received %.3g endpoint changes per second over the last %s (%g changes; limit %g/s): every change makes it rewrite rules, in iptables mode under the xtables lock, so syncs slow down and other programs wait on the lock",
			rate, covered.Round(time.Second), changes, p.MaxPerSecond),
		Evidence: map[string]any{"changesPerSecond": rate, "changes": changes, "windowSeconds": covered.Seconds(), "maxPerSecond": p.MaxPerSecond},
	}
}

type kubeProxyAPIErrors struct {
	p KubeProxyAPIErrorsParams
	n *node.Node

	mu sync.Mutex
	w  window[map[string]float64]
	judgement
}

func (d *kubeProxyAPIErrors) Detect(ctx context.Context) ([]finding.Finding, error) {
	_, sc, err := kubeProxyScrape(ctx, d.n)
	if err != nil {
		return nil, err
	}
	if sc.Metrics.RESTRequests == nil {
		return nil, finding.Skip("kube-proxy does not export rest_client_requests_total")
	}
	codes := make(map[string]float64, len(sc.Metrics.RESTRequests))
	for c, v := range sc.Metrics.RESTRequests {
		codes[c] = v
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delta, covered, st := d.w.advance(sc.Seq, sc.At, codes, d.p.Window.Duration, func(newer, older map[string]float64) (map[string]float64, bool) {
		return codeIncrease(older, newer)
	})
	switch st {
	case windowShort:
		d.set("kube-proxy's API requests: one scrape so far")
		return nil, nil
	case windowRestarted:
		d.set("kube-proxy's API request counters restarted")
		return nil, nil
	}
	fd := apiErrorsFinding(delta, covered, d.p)
	errs, total := restSums(delta)
	d.set("%g of kube-proxy's %g API requests failed in the last %s (limit %d)", errs, total, covered.Round(time.Second), d.p.MaxErrors)
	if fd == nil {
		return nil, nil
	}
	return []finding.Finding{*fd}, nil
}

// codeIncrease is newer - older per code (a code absent before counts
// from 0); ok is false when any count went down.
func codeIncrease(older, newer map[string]float64) (map[string]float64, bool) {
	out := map[string]float64{}
	for c, v := range newer {
		d := v - older[c]
		if d < 0 {
			return nil, false
		}
		if d > 0 {
			out[c] = d
		}
	}
	for c := range older {
		if _, ok := newer[c]; !ok {
			return nil, false
		}
	}
	return out, true
}

// restSums is the failed and all requests of an increase.
func restSums(delta map[string]float64) (errs, total float64) {
	for c, v := range delta {
		total += v
		if kubeproxy.IsRESTError(c) {
			errs += v
		}
	}
	return errs, total
}

// apiErrorsFinding is KubeProxyAPIErrors' decision on the requests of a
// window by code: critical when no request succeeded (kube-proxy hears
// nothing), else a warning.
func apiErrorsFinding(delta map[string]float64, covered time.Duration, p KubeProxyAPIErrorsParams) *finding.Finding {
	errs, total := restSums(delta)
	if !(errs > float64(p.MaxErrors)) {
		return nil
	}
	byCode := map[string]float64{}
	var codes []string
	for c, v := range delta {
		if kubeproxy.IsRESTError(c) {
			byCode[c] = v
			codes = append(codes, fmt.Sprintf("%s: %g", c, v))
		}
	}
	sort.Strings(codes)
	sev, why := finding.Warning, "its watches may miss Service and endpoint changes and the rules go stale"
	if errs == total {
		sev, why = finding.Critical, "none succeeded: kube-proxy is not hearing the API server, the rules go stale with the next change"
	}
	return &finding.Finding{
		Detector: "KubeProxyAPIErrors",
		// The counter is client-go's, node-wide.
		Target:   "kube-proxy/api-requests",
		Severity: sev,
		Message: fmt.Sprintf("%g of kube-proxy's %g requests to the API server failed in the last %s (%v; limit %d): %s",
			errs, total, covered.Round(time.Second), codes, p.MaxErrors, why),
		Evidence: map[string]any{"errorsByCode": byCode, "errors": errs, "requests": total, "windowSeconds": covered.Seconds(), "maxErrors": p.MaxErrors},
	}
}
