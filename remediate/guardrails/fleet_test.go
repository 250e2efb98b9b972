package guardrails

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

type src[T any] struct {
	obj   *T
	known bool
}

func (s src[T]) Get() (*T, bool) { return s.obj, s.known }

func blockedBy(err error) string {
	var b *Blocked
	if errors.As(err, &b) {
		return b.Guardrail + ": " + b.Reason
	}
	if err != nil {
		return "error: " + err.Error()
	}
	return ""
}

func TestFleetPause(t *testing.T) {
	now := time.Now()
	cm := func(data map[string]string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "remediate-fleet"}, Data: data}
	}
	for _, tc := range []struct {
		name string
		src  ObjectSource[corev1.ConfigMap]
		want string
	}{
		{"no access", nil, ""},
		{"not listed yet", src[corev1.ConfigMap]{}, ""},
		{"absent", src[corev1.ConfigMap]{known: true}, ""},
		{"no key", src[corev1.ConfigMap]{cm(map[string]string{"other": "x"}), true}, ""},
		{"false", src[corev1.ConfigMap]{cm(map[string]string{"pause": " False "}), true}, ""},
		{"empty", src[corev1.ConfigMap]{cm(map[string]string{"pause": ""}), true}, ""},
		{"paused", src[corev1.ConfigMap]{cm(map[string]string{"pause": "upgrade to 1.35"}), true},
			"fleet-pause: fleet paused (ConfigMap kube-system/remediate-fleet key pause): upgrade to 1.35"},
		{"long reason bounded", src[corev1.ConfigMap]{cm(map[string]string{"pause": strings.Repeat("x", 5000)}), true},
			"fleet-pause: fleet paused (ConfigMap kube-system/remediate-fleet key pause): " + strings.Repeat("x", 200) + "..."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g *FleetPause
			if tc.src == nil {
				g = NewFleetPause(nil, "kube-system")
			} else {
				g = NewFleetPause(tc.src, "kube-system")
			}
			// Node-local and disruptive alike, dry runs too (audit shows it).
			for _, r := range []*Request{req("r", "t", "KillProcess", false, false, now), req("r", "t", "RestartKubeProxy", true, true, now)} {
				if got := blockedBy(g.Check(context.Background(), r)); got != tc.want {
					t.Errorf("got %q, want %q", got, tc.want)
				}
			}
			if p, _ := g.Paused(); p != (tc.want != "") {
				t.Errorf("Paused() = %v", p)
			}
		})
	}
}

func TestKubeProxyRollout(t *testing.T) {
	now := time.Now()
	ds := func(gen, observed int64, desired, updated, available int32) *appsv1.DaemonSet {
		return &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-proxy", Generation: gen},
			Status: appsv1.DaemonSetStatus{ObservedGeneration: observed, DesiredNumberScheduled: desired,
				UpdatedNumberScheduled: updated, NumberAvailable: available}}
	}
	for _, tc := range []struct {
		name string
		src  ObjectSource[appsv1.DaemonSet]
		want string
	}{
		{"unknown", src[appsv1.DaemonSet]{}, ""},
		{"no DaemonSet (static pods)", src[appsv1.DaemonSet]{known: true}, ""},
		{"settled", src[appsv1.DaemonSet]{ds(3, 3, 5, 5, 5), true}, ""},
		{"new spec not observed", src[appsv1.DaemonSet]{ds(4, 3, 5, 5, 5), true},
			"kube-proxy-rollout: disruptive action held while kube-proxy rolls out: DaemonSet kube-system/kube-proxy: generation 4 not yet observed (at 3)"},
		{"updating", src[appsv1.DaemonSet]{ds(4, 4, 5, 2, 5), true},
			"kube-proxy-rollout: disruptive action held while kube-proxy rolls out: DaemonSet kube-system/kube-proxy rolling out: 2 of 5 pods updated"},
		{"updated, not available", src[appsv1.DaemonSet]{ds(4, 4, 5, 5, 4), true},
			"kube-proxy-rollout: disruptive action held while kube-proxy rolls out: DaemonSet kube-system/kube-proxy rolling out: 4 of 5 pods available"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewKubeProxyRollout(tc.src)
			if got := blockedBy(g.Check(context.Background(), req("r", "t", "RestartKubeProxy", true, false, now))); got != tc.want {
				t.Errorf("disruptive: got %q, want %q", got, tc.want)
			}
			if got := blockedBy(g.Check(context.Background(), req("r", "t", "RaiseConntrackMax", false, false, now))); got != "" {
				t.Errorf("non-disruptive blocked: %q", got)
			}
		})
	}
	if err := NewKubeProxyRollout(nil).Check(context.Background(), req("r", "t", "RestartKubeProxy", true, false, now)); err != nil {
		t.Error(err)
	}
}
