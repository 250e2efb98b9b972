package action

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

func kpPod(name, nodeName string, uid types.UID, ready bool, owner string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-system", UID: uid, Labels: map[string]string{"k8s-app": "kube-proxy"}},
		Spec:       corev1.PodSpec{NodeName: nodeName},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if owner != "" {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: owner, Name: "kube-proxy", Controller: ptr.To(true), APIVersion: "apps/v1", UID: "ds"}}
	}
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}
	return p
}

func newRestart(t *testing.T, n *node.Node, timeout time.Duration) Action {
	t.Helper()
	typ, _ := Lookup("RestartKubeProxy")
	p := typ.NewParams().(*RestartKubeProxyParams)
	p.ReadyTimeout, p.PollInterval = policy.D(timeout), policy.D(20*time.Millisecond)
	a, err := typ.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// The kube-proxy /healthz answers of an unhealthy and a healthy kube-proxy.
const (
	unhealthyHealthz = `{"lastUpdated":"2026-11-21T12:00:00Z","currentTime":"2026-11-21T12:01:30Z","nodeEligible":true,"healthy":false,"status":{"IPv4":{"lastUpdated":"2026-11-21T12:00:00Z","healthy":false}}}`
	healthyHealthz   = `{"lastUpdated":"2026-11-21T12:01:30Z","currentTime":"2026-11-21T12:01:30Z","nodeEligible":true,"healthy":true,"status":{"IPv4":{"lastUpdated":"2026-11-21T12:01:30Z","healthy":true}}}`
)

// waitGone returns once pod kube-system/name is gone from cs.
func waitGone(cs *fake.Clientset, name string) {
	for {
		if _, err := cs.CoreV1().Pods("kube-system").Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// daemonSetController stands in for the DaemonSet controller on cs: every
// 20 ms, when kube-system has no pod left, it creates a Ready kube-proxy pod
// of node n1 with a new name and UID. It runs until the returned stop is
// called (stop waits for it to end) or the test ends.
func daemonSetController(t *testing.T, cs *fake.Clientset) (stop func()) {
	ctx := context.Background()
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for k := 0; ; k++ {
			select {
			case <-quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if l, _ := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{}); len(l.Items) == 0 {
				_, _ = cs.CoreV1().Pods("kube-system").Create(ctx, kpPod(fmt.Sprintf("kp-%d", k), "n1", types.UID(fmt.Sprint(k)), true, "DaemonSet"), metav1.CreateOptions{})
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(quit); <-done }) }
	t.Cleanup(stop)
	return stop
}

// kpFinding is a kube-proxy finding as the engine hands it over (its kind
// filled in from the detector's declaration).
var kpFinding = finding.Finding{Target: "kube-proxy/IPv4", Subject: finding.Subject{Kind: finding.KindKubeProxy}}

func TestRestartKubeProxyRefusals(t *testing.T) {
	ctx := context.Background()
	f := kpFinding
	for _, tc := range []struct {
		name string
		objs []*corev1.Pod
		skip string
		err  string
	}{
		{"none", nil, "no pod matching", ""},
		{"other node only", []*corev1.Pod{kpPod("kp-b", "n2", "b", true, "DaemonSet")}, "no pod matching", ""},
		{"static pod", []*corev1.Pod{kpPod("kp-a", "n1", "a", true, "")}, "not managed by a DaemonSet", ""},
		{"ambiguous", []*corev1.Pod{kpPod("kp-a", "n1", "a", true, "DaemonSet"), kpPod("kp-c", "n1", "c", true, "DaemonSet")}, "", "ambiguous"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			for _, p := range tc.objs {
				_, _ = cs.CoreV1().Pods("kube-system").Create(ctx, p, metav1.CreateOptions{})
			}
			a := newRestart(t, &node.Node{Name: "n1", Kube: cs}, time.Minute)
			_, err := a.Plan(ctx, f)
			if reason, ok := finding.IsSkip(err); tc.skip != "" && (!ok || !strings.Contains(reason, tc.skip)) {
				t.Fatalf("want skip %q, got %v", tc.skip, err)
			}
			if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("want error %q, got %v", tc.err, err)
			}
			if _, err := a.Execute(ctx, f); err == nil {
				t.Fatal("Execute acted")
			}
			if l, _ := cs.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{}); len(l.Items) != len(tc.objs) {
				t.Fatal("a pod was deleted")
			}
		})
	}
	if _, err := newRestart(t, &node.Node{Name: "n1", Unavailable: map[string]string{"kubernetes": "no cluster access: x"}}, time.Minute).Plan(ctx, f); err == nil {
		t.Fatal("no client: no skip")
	} else if r, _ := finding.IsSkip(err); r != "no cluster access: x" {
		t.Fatalf("got %v", err)
	}
}

func TestRestartKubeProxyReplaces(t *testing.T) {
	ctx := context.Background()
	// Field selectors are not honoured by the fake for spec.nodeName, so
	// only this node's pod exists.
	cs := fake.NewClientset(kpPod("kp-a", "n1", "a", true, "DaemonSet"))
	a := newRestart(t, &node.Node{Name: "n1", Kube: cs}, 5*time.Second)
	plan, err := a.Plan(ctx, kpFinding)
	if err != nil || !strings.Contains(plan.Summary, "kube-system/kp-a (uid a)") {
		t.Fatalf("plan %+v %v", plan, err)
	}
	// The "DaemonSet controller": after the delete, a new pod appears,
	// first not ready, then ready.
	go func() {
		waitGone(cs, "kp-a")
		_, _ = cs.CoreV1().Pods("kube-system").Create(ctx, kpPod("kp-z", "n1", "z", false, "DaemonSet"), metav1.CreateOptions{})
		time.Sleep(100 * time.Millisecond)
		_, _ = cs.CoreV1().Pods("kube-system").UpdateStatus(ctx, kpPod("kp-z", "n1", "z", true, "DaemonSet"), metav1.UpdateOptions{})
	}()
	res, err := a.Execute(ctx, kpFinding)
	if err != nil {
		t.Fatal(err)
	}
	if res.Details["newPod"] != "kp-z" || res.Details["oldUID"] != "a" || !strings.HasPrefix(res.Details["syncCheck"].(string), "not checked") {
		t.Fatalf("result %+v", res)
	}

	// With the kube-proxy adapter: success needs /healthz healthy too. A
	// "DaemonSet controller" replaces the pod whenever it is gone.
	stopController := daemonSetController(t, cs)
	kp := kubeproxy.NewFake(clock.RealClock{}, 30*time.Second)
	kp.SetHealthz(503, unhealthyHealthz)
	a = newRestart(t, &node.Node{Name: "n1", Kube: cs, KubeProxy: kp}, 500*time.Millisecond)
	if _, err := a.Execute(ctx, kpFinding); err == nil || !strings.Contains(err.Error(), "sync did not recover") {
		t.Fatalf("unhealthy kube-proxy after restart: %v", err)
	}
	kp.SetHealthz(200, healthyHealthz)
	a = newRestart(t, &node.Node{Name: "n1", Kube: cs, KubeProxy: kp}, 5*time.Second)
	res, err = a.Execute(ctx, kpFinding)
	if err != nil || res.Details["syncRecoveredAfter"] == nil {
		t.Fatalf("healthy kube-proxy after restart: %+v %v", res, err)
	}
	stopController()

	// Without a replacement: a bounded wait, then failure.
	a = newRestart(t, &node.Node{Name: "n1", Kube: cs}, 200*time.Millisecond)
	start := time.Now()
	if _, err := a.Execute(ctx, kpFinding); err == nil || !strings.Contains(err.Error(), "no Ready replacement") {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 3*time.Second {
		t.Fatal("wait not bounded")
	}
}

func TestCordonNode(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	typ, _ := Lookup("CordonNode")
	mk := func(p *CordonNodeParams) Action {
		a, err := typ.New(p, &node.Node{Name: "n1", Kube: cs})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	f := finding.Finding{Detector: "KubeProxySyncStale", Target: "kube-proxy/IPv4"}
	if _, err := mk(typ.NewParams().(*CordonNodeParams)).Plan(ctx, f); err == nil {
		t.Fatal("disabled by default, yet planned")
	} else if r, ok := finding.IsSkip(err); !ok || !strings.Contains(r, "off") {
		t.Fatalf("got %v", err)
	}
	p := &CordonNodeParams{Enabled: true, Taint: &TaintParams{Key: "remediate.dev/dataplane", Effect: "NoSchedule"}}
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatal(errs)
	}
	if errs := (&CordonNodeParams{Taint: &TaintParams{Key: "bad key", Effect: "Never"}}).Validate(); len(errs) != 2 {
		t.Fatalf("validation: %v", errs)
	}
	a := mk(p)
	if plan, err := a.Plan(ctx, f); err != nil || !strings.Contains(plan.Summary, "taint it remediate.dev/dataplane=:NoSchedule") {
		t.Fatalf("plan %+v %v", plan, err)
	}
	if _, err := a.Execute(ctx, f); err != nil {
		t.Fatal(err)
	}
	n, _ := cs.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	rec, ours := kube.CordonedBy(n)
	if !n.Spec.Unschedulable || !ours || rec.Detector != "KubeProxySyncStale" || len(n.Spec.Taints) != 1 {
		t.Fatalf("node %+v", n)
	}
	if _, err := a.Plan(ctx, f); err == nil {
		t.Fatal("second cordon planned")
	}
}

// TestRestartKubeProxyDefaultWaitFitsTheActionTimeout: with default
// settings the wait for the replacement must end before the engine abandons
// the action (which then counts a failed attempt after the pod was deleted).
func TestRestartKubeProxyDefaultWaitFitsTheActionTimeout(t *testing.T) {
	typ, ok := Lookup("RestartKubeProxy")
	if !ok {
		t.Fatal("RestartKubeProxy not registered")
	}
	p := typ.NewParams().(*RestartKubeProxyParams)
	if p.ReadyTimeout.Duration >= policy.DefaultActionTimeout {
		t.Fatalf("default readyTimeout %s >= default actionTimeout %s", p.ReadyTimeout.Duration, policy.DefaultActionTimeout)
	}
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
}

// TestOneActionRestartsKubeProxy: RestartKubeProxy is RestartNodeAgent
// under its old name (registered as replaced by it), so both get
// RestartNodeAgent's identity checks: a pod of another DaemonSet matching
// the selector is no replacement (the old action took it).
func TestOneActionRestartsKubeProxy(t *testing.T) {
	typ, _ := Lookup("RestartKubeProxy")
	if typ.ReplacedBy != "RestartNodeAgent" || typ.Deprecation == "" {
		t.Fatalf("RestartKubeProxy not registered as replaced by RestartNodeAgent: %+v", typ)
	}
	if a, ok := newRestart(t, &node.Node{Name: "n1"}, time.Minute).(*restartNodeAgent); !ok || len(a.p.Agents) != 1 || a.p.Agents[0].Name != "kube-proxy" {
		t.Fatalf("RestartKubeProxy builds %#v, want RestartNodeAgent on kube-proxy alone", a)
	}
	ctx := context.Background()
	cs := fake.NewClientset(kpPod("kp-a", "n1", "a", true, "DaemonSet"))
	go func() {
		waitGone(cs, "kp-a")
		other := kpPod("kp-other", "n1", "o", true, "DaemonSet")
		other.OwnerReferences[0].UID = "another-ds"
		_, _ = cs.CoreV1().Pods("kube-system").Create(ctx, other, metav1.CreateOptions{})
	}()
	_, err := newRestart(t, &node.Node{Name: "n1", Kube: cs}, 300*time.Millisecond).Execute(ctx, kpFinding)
	if err == nil || !strings.Contains(err.Error(), "no Ready replacement") {
		t.Fatalf("another DaemonSet's pod taken for kube-proxy's replacement: %v", err)
	}
}

// TestRestartNodeAgentRestartsKubeProxyAsRestartKubeProxyDid: the one
// action takes the findings RestartKubeProxy took (kube-proxy's rules:
// iptables, IPVS, nftables) and, restarting kube-proxy, waits for its
// /healthz as RestartKubeProxy did: Ready is not yet programming rules.
func TestRestartNodeAgentRestartsKubeProxyAsRestartKubeProxyDid(t *testing.T) {
	ctx := context.Background()
	at, _ := Lookup("RestartNodeAgent")
	old, _ := Lookup("RestartKubeProxy")
	for _, k := range old.ActsOn {
		if !at.CanActOn("", []finding.Kind{k}) {
			t.Errorf("RestartNodeAgent does not act on %s, which RestartKubeProxy did", k)
		}
	}
	cs := fake.NewClientset(kpPod("kp-a", "n1", "a", true, "DaemonSet"))
	daemonSetController(t, cs)
	kp := kubeproxy.NewFake(clock.RealClock{}, 30*time.Second)
	kp.SetHealthz(503, unhealthyHealthz)
	n := &node.Node{Name: "n1", Kube: cs, KubeProxy: kp}
	rules := finding.Finding{Target: "iptables/nat/KUBE-SERVICES", Subject: finding.Subject{Kind: finding.KindIPTablesRules}}
	if plan, err := newRestartAgent(t, n, time.Second).Plan(ctx, rules); err != nil || !strings.Contains(plan.Summary, "kube-proxy pod kube-system/kp-a") {
		t.Fatalf("a finding about kube-proxy's rules: %+v %v", plan, err)
	}
	if _, err := newRestartAgent(t, n, 500*time.Millisecond).Execute(ctx, kpFinding); err == nil || !strings.Contains(err.Error(), "sync did not recover") {
		t.Fatalf("kube-proxy restarted, Ready, /healthz unhealthy: %v", err)
	}
	kp.SetHealthz(200, healthyHealthz)
	res, err := newRestartAgent(t, n, 5*time.Second).Execute(ctx, rules)
	if err != nil || res.Details["syncRecoveredAfter"] == nil || !strings.Contains(res.Summary, "/healthz healthy after") {
		t.Fatalf("kube-proxy restarted and healthy: %+v %v", res, err)
	}
}
