package guardrails

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/remediate-dev/remediate/internal/kube"
)

// ObjectSource returns the last known object (nil: it does not exist) and
// whether it is known at all (internal/kube.OneWatch).
type ObjectSource[T any] interface {
	Get() (*T, bool)
}

// FleetPause blocks every action (node-local ones too) on every node while
// the fleet ConfigMap (internal/kube.FleetConfigMap) carries a pause. An
// unknown state (no cluster access, not listed yet) allows, as the opt-out
// does: a node without the API keeps healing locally, and API-dependent
// actions are blocked by the freshness guardrail anyway.
type FleetPause struct {
	src ObjectSource[corev1.ConfigMap]
	ns  string
}

// NewFleetPause returns the guardrail over src (nil: no cluster access).
func NewFleetPause(src ObjectSource[corev1.ConfigMap], ns string) *FleetPause {
	return &FleetPause{src: src, ns: ns}
}

// Name implements Guardrail.
func (g *FleetPause) Name() string { return GuardFleetPause }

// Paused says whether the fleet is paused now and why.
func (g *FleetPause) Paused() (bool, string) {
	if g == nil || g.src == nil {
		return false, ""
	}
	cm, ok := g.src.Get()
	if !ok {
		return false, ""
	}
	return kube.Paused(cm)
}

// Check implements Guardrail.
func (g *FleetPause) Check(_ context.Context, _ *Request) error {
	if p, why := g.Paused(); p {
		return Block(g.Name(), "fleet paused (ConfigMap %s/%s key %s): %s", g.ns, kube.FleetConfigMap, kube.PauseKey, why)
	}
	return nil
}

// KubeProxyRollout holds disruptive actions (restarting kube-proxy,
// deleting IPVS entries...) while kube-proxy's DaemonSet is rolling out:
// its pods come and go by design then, and a restart would fight the
// rollout. Node-local, non-disruptive actions go on. Unknown allows (see
// FleetPause); a missing DaemonSet (static pods) allows.
type KubeProxyRollout struct {
	src ObjectSource[appsv1.DaemonSet]
}

// NewKubeProxyRollout returns the guardrail over src (nil: no access).
func NewKubeProxyRollout(src ObjectSource[appsv1.DaemonSet]) *KubeProxyRollout {
	return &KubeProxyRollout{src: src}
}

// Name implements Guardrail.
func (g *KubeProxyRollout) Name() string { return GuardKubeProxyRollout }

// Check implements Guardrail.
func (g *KubeProxyRollout) Check(_ context.Context, r *Request) error {
	if g.src == nil || !r.Disruptive {
		return nil
	}
	ds, ok := g.src.Get()
	if !ok {
		return nil
	}
	if rolling, why := kube.RollingOut(ds); rolling {
		return Block(g.Name(), "disruptive action held while kube-proxy rolls out: %s", why)
	}
	return nil
}
