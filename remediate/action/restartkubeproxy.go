package action

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// RestartKubeProxyParams are the bounds of RestartKubeProxy.
type RestartKubeProxyParams struct {
	// Namespace of the kube-proxy pods.
	Namespace string `yaml:"namespace"`
	// LabelSelector selecting kube-proxy pods.
	LabelSelector string `yaml:"labelSelector"`
	// ReadyTimeout bounds the wait for the replacement pod to be Ready and,
	// where the kube-proxy adapter is available, for kube-proxy's /healthz
	// to report healthy (its sync recovered). Keep it under actionTimeout:
	// the engine abandons the action at actionTimeout (default 60s), after
	// the pod was deleted, and counts a failed attempt.
	ReadyTimeout policy.Duration `yaml:"readyTimeout"`
	// PollInterval between checks of the replacement pod.
	PollInterval policy.Duration `yaml:"pollInterval"`
}

// SetDefaults sets the defaults of RestartKubeProxy (registry.Defaulter).
func (p *RestartKubeProxyParams) SetDefaults() {
	*p = RestartKubeProxyParams{Namespace: "kube-system", LabelSelector: "k8s-app=kube-proxy",
		ReadyTimeout: policy.D(50 * time.Second), PollInterval: policy.D(2 * time.Second)}
}

// Validate implements policy.Validator.
func (p *RestartKubeProxyParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Namespace == "" {
		errs = append(errs, policy.FieldError{Field: "namespace", Msg: "must not be empty"})
	}
	if sel, err := labels.Parse(p.LabelSelector); err != nil {
		errs = append(errs, policy.FieldError{Field: "labelSelector", Msg: err.Error()})
	} else if sel.Empty() {
		errs = append(errs, policy.FieldError{Field: "labelSelector", Msg: "must not be empty (it would match every pod)"})
	}
	return append(errs, validateReadyWait(p.ReadyTimeout, p.PollInterval)...)
}

func init() {
	Define("RestartKubeProxy",
		"deletes this node's kube-proxy pod (DaemonSet-managed only) and waits for its replacement to be Ready",
		newRestartKubeProxy, Disruptive(), ActsOn(finding.KindKubeProxy, finding.KindIPTablesRules, finding.KindIPVSMissingVirtualServer, finding.KindNFTablesTable))
}

type restartKubeProxy struct {
	p   RestartKubeProxyParams
	sel labels.Selector
	n   *node.Node
}

func newRestartKubeProxy(p *RestartKubeProxyParams, n *node.Node) (Action, error) {
	sel, err := labels.Parse(p.LabelSelector)
	if err != nil {
		return nil, fmt.Errorf("labelSelector: %w", err)
	}
	return &restartKubeProxy{p: *p, sel: sel, n: n}, nil
}

func (a *restartKubeProxy) clock() clock.PassiveClock {
	if a.n.Clock != nil {
		return a.n.Clock
	}
	return clock.RealClock{}
}

// target finds the one kube-proxy pod of this node. Zero is a skip; more
// than one, or a pod not managed by a DaemonSet (a static pod's mirror,
// whose deletion restarts nothing), is a refusal.
func (a *restartKubeProxy) target(ctx context.Context) (*corev1.Pod, error) {
	if a.n.Kube == nil {
		return nil, finding.Skip("%s", a.n.Why("kubernetes"))
	}
	pods, err := kubeProxyPods(ctx, a.n.Kube, a.p.Namespace, a.sel, a.n.Name)
	if err != nil {
		return nil, err
	}
	var live []corev1.Pod
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	switch {
	case len(live) == 0 && len(pods) > 0:
		return nil, finding.Skip("kube-proxy pod %s/%s on node %s is already terminating", pods[0].Namespace, pods[0].Name, a.n.Name)
	case len(live) == 0:
		return nil, finding.Skip("no pod matching %q in namespace %s on node %s", a.p.LabelSelector, a.p.Namespace, a.n.Name)
	case len(live) > 1:
		names := make([]string, len(live))
		for i, p := range live {
			names[i] = p.Name
		}
		return nil, fmt.Errorf("refusing: %d pods match %q on node %s (%s): which one is kube-proxy is ambiguous",
			len(live), a.p.LabelSelector, a.n.Name, strings.Join(names, ", "))
	}
	pod := live[0]
	if c := metav1.GetControllerOf(&pod); c == nil || c.Kind != "DaemonSet" {
		return nil, finding.Skip("pod %s/%s is not managed by a DaemonSet (static pod?): deleting it would not restart kube-proxy", pod.Namespace, pod.Name)
	}
	return &pod, nil
}

func kubeProxyPods(ctx context.Context, cs kubernetes.Interface, ns string, sel labels.Selector, nodeName string) ([]corev1.Pod, error) {
	l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{
		LabelSelector: sel.String(),
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("listing kube-proxy pods in %s (%s) on node %s: %w", ns, sel, nodeName, err)
	}
	// The field selector already did this; be sure anyway.
	out := l.Items[:0]
	for _, p := range l.Items {
		if p.Spec.NodeName == nodeName {
			out = append(out, p)
		}
	}
	return out, nil
}

func (a *restartKubeProxy) Plan(ctx context.Context, _ finding.Finding) (Plan, error) {
	pod, err := a.target(ctx)
	if err != nil {
		return Plan{}, err
	}
	return Plan{
		Summary: fmt.Sprintf("delete kube-proxy pod %s/%s (uid %s) on node %s and wait up to %s for its replacement to be Ready",
			pod.Namespace, pod.Name, pod.UID, a.n.Name, a.p.ReadyTimeout.Duration),
		Details: map[string]any{"namespace": pod.Namespace, "pod": pod.Name, "uid": string(pod.UID)},
	}, nil
}

func (a *restartKubeProxy) Execute(ctx context.Context, _ finding.Finding) (Result, error) {
	// Re-check right before acting: the pod may have been replaced since
	// Plan.
	pod, err := a.target(ctx)
	if err != nil {
		return Result{}, err
	}
	start := a.clock().Now()
	uid := pod.UID
	err = a.n.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return Result{}, fmt.Errorf("deleting pod %s/%s (uid %s): %w", pod.Namespace, pod.Name, uid, err)
	}
	details := map[string]any{"namespace": pod.Namespace, "oldPod": pod.Name, "oldUID": string(uid)}
	wctx, cancel := context.WithTimeout(ctx, a.p.ReadyTimeout.Duration)
	defer cancel()
	t := time.NewTicker(a.p.PollInterval.Duration)
	defer t.Stop()
	p, last := waitReplacement(wctx, t.C, func(ctx context.Context) ([]corev1.Pod, error) {
		return kubeProxyPods(ctx, a.n.Kube, a.p.Namespace, a.sel, a.n.Name)
	}, uid)
	if p == nil {
		return Result{Summary: "kube-proxy pod deleted, replacement not Ready", Details: details},
			fmt.Errorf("deleted pod %s/%s but no Ready replacement within %s: %s", pod.Namespace, pod.Name, a.p.ReadyTimeout.Duration, last)
	}
	details["newPod"], details["newUID"] = p.Name, string(p.UID)
	details["readyAfter"] = a.clock().Since(start).Round(time.Millisecond).String()
	summary := fmt.Sprintf("deleted kube-proxy pod %s/%s; replacement %s Ready after %s",
		pod.Namespace, pod.Name, p.Name, details["readyAfter"])
	if err := a.waitSynced(wctx, t, details); err != nil {
		return Result{Summary: summary + "; sync not recovered", Details: details}, err
	}
	if details["syncRecoveredAfter"] != nil {
		summary += fmt.Sprintf(", /healthz healthy after %s", details["syncRecoveredAfter"])
	}
	return Result{Summary: summary, Details: details}, nil
}

// waitSynced waits for kube-proxy's /healthz to report healthy, through the
// kube-proxy adapter; without the adapter it records why it did not check.
func (a *restartKubeProxy) waitSynced(ctx context.Context, t *time.Ticker, details map[string]any) error {
	if a.n.KubeProxy == nil {
		details["syncCheck"] = "not checked: " + a.n.Why("kube-proxy")
		return nil
	}
	start := a.clock().Now()
	last := "no answer yet"
	for {
		h, err := a.n.KubeProxy.Healthz(ctx)
		switch {
		case err != nil:
			last = err.Error()
		case h.Healthy:
			details["syncRecoveredAfter"] = a.clock().Since(start).Round(time.Millisecond).String()
			return nil
		default:
			last = fmt.Sprintf("/healthz %d, healthy=false", h.StatusCode)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replacement kube-proxy is Ready but its sync did not recover within %s: %s", a.p.ReadyTimeout.Duration, last)
		case <-t.C:
		}
	}
}
