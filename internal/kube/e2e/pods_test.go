package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/internal/testing/fakekubelet"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/action"
)

// podsNS is the test-made namespace of the workload pods.
const podsNS = "pods-e2e"

type recordRT struct {
	next http.RoundTripper
	mu   *sync.Mutex
	urls *[]string
}

func (r recordRT) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.Contains(req.URL.Path, "/pods") {
		r.mu.Lock()
		*r.urls = append(*r.urls, req.Method+" "+req.URL.RequestURI())
		r.mu.Unlock()
	}
	return r.next.RoundTrip(req)
}

// testNodePods: the pods of node n1 as the daemon (the ServiceAccount on
// n1, enforce RBAC and admission policy) watches them, with their status
// written as a kubelet would (no kubelet runs here): a pod without sandbox
// past minAge is found and clears when fixed, many are one finding, a pod
// of n2 is never seen; the CNI agent's pod not Ready, restarting and
// OOM-killed is found and clears; RestartNodeAgent deletes n1's agent pod
// and refuses n2's and a workload's, which the admission policy refuses
// server-side too.
func testNodePods(t *testing.T, cp *controlplane.ControlPlane) {
	ctx := context.Background()
	admin := cp.Client
	for _, ns := range []string{podsNS, "calico-system"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// Calico by the Tigera operator lives in calico-system: its component
	// grants the pod delete there (RBAC refuses it without; testPermissions).
	deploytest.ApplyEnforceWith(t, cp, "node-agents-calico-system")
	var mu sync.Mutex
	var urls []string
	c, err := kube.NewClient(deploytest.AsDaemon(cp, "n1"), kube.Options{QPS: 50, Burst: 100,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return recordRT{next: rt, mu: &mu, urls: &urls} }})
	if err != nil {
		t.Fatal(err)
	}
	pw := syncedPodWatch(ctx, t, c, "n1")
	n := &node.Node{Name: "n1", Clock: clock.RealClock{}, Pods: pw, Kube: c.Interface}
	build := func(typ string, set func(any)) detect.Detector {
		ty, _ := detect.Lookup(typ)
		p := ty.NewParams()
		set(p)
		if errs := p.(policy.Validator).Validate(); len(errs) > 0 {
			t.Fatal(errs)
		}
		d, err := ty.New(p, n)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	podsDet := build("PodsNetworkNotReady", func(p any) { p.(*detect.PodsNetworkNotReadyParams).MinAge = policy.D(3 * time.Second) })
	agentDet := build("CNIAgentUnhealthy", func(p any) {
		pp := p.(*detect.CNIAgentUnhealthyParams)
		pp.NotReadyFor, pp.RestartWindow = policy.D(time.Second), policy.D(4*time.Second)
	})
	detectUntil := func(d detect.Detector, what string, ok func([]finding.Finding) bool) []finding.Finding {
		t.Helper()
		var fs []finding.Finding
		waitFor(t, 20*time.Second, what, func() (bool, string) {
			var err error
			fs, err = d.Detect(ctx)
			return err == nil && ok(fs), fmt.Sprintf("%+v %v", fs, err)
		})
		return fs
	}
	none := func(fs []finding.Finding) bool { return len(fs) == 0 }

	// A workload pod on n1 stuck without sandbox, and one on n2.
	fakekubelet.Create(t, admin, fakekubelet.Workload(podsNS, "stuck-1", "n1"), fakekubelet.SandboxNotReady(time.Now()))
	fakekubelet.Create(t, admin, fakekubelet.Workload(podsNS, "other-node", "n2"), fakekubelet.SandboxNotReady(time.Now().Add(-time.Hour)))
	detectUntil(podsDet, "the pod watch seeing stuck-1", func(fs []finding.Finding) bool {
		return len(pw.NodePods()) == 1 && len(fs) == 0 // young: under minAge
	})
	fs := detectUntil(podsDet, "stuck-1 past minAge", func(fs []finding.Finding) bool { return len(fs) == 1 })
	if fs[0].Target != cluster.NodePodsTarget || fs[0].Evidence["stuckPods"] != 1 || !strings.Contains(fs[0].Message, podsNS+"/stuck-1") ||
		strings.Contains(fs[0].Message, "other-node") || !strings.Contains(fs[0].Message, "no CNI agent pod found") {
		t.Fatalf("finding %+v", fs[0])
	}
	// Fixed as the kubelet would write it: sandbox ready, Running.
	fakekubelet.SetStatus(t, admin, podsNS, "stuck-1", fakekubelet.Running(0, nil))
	detectUntil(podsDet, "stuck-1 fixed", none)

	// Many stuck pods: one finding counting them, ten named.
	for i := 0; i < 12; i++ {
		fakekubelet.Create(t, admin, fakekubelet.Workload(podsNS, fmt.Sprintf("batch-%02d", i), "n1"), fakekubelet.SandboxNotReady(time.Now().Add(-time.Minute)))
	}
	fs = detectUntil(podsDet, "12 stuck pods", func(fs []finding.Finding) bool { return len(fs) == 1 && fs[0].Evidence["stuckPods"] == 12 })
	if l := fs[0].Evidence["pods"].([]map[string]any); len(l) != 10 || !strings.Contains(fs[0].Message, "and 2 more") {
		t.Errorf("many: %d listed, %q", len(l), fs[0].Message)
	}

	// The CNI agent, Ready: no finding; the pods finding names it.
	fakekubelet.Create(t, admin, fakekubelet.CalicoNode("calico-system", "calico-node-n1", "n1"), fakekubelet.Running(0, nil))
	fakekubelet.Create(t, admin, fakekubelet.CalicoNode("calico-system", "calico-node-n2", "n2"), fakekubelet.Running(0, nil))
	detectUntil(agentDet, "agent Ready", func(fs []finding.Finding) bool { return len(fs) == 0 && len(pw.NodePods()) == 14 })
	detectUntil(podsDet, "pods finding with the agent", func(fs []finding.Finding) bool {
		return len(fs) == 1 && strings.Contains(fs[0].Message, "CNI agent calico-system/calico-node-n1 Ready")
	})
	// Not Ready.
	nr := fakekubelet.Running(0, nil)
	nr.Conditions[1] = corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(time.Now().Add(-time.Minute))}
	fakekubelet.SetStatus(t, admin, "calico-system", "calico-node-n1", nr)
	fs = detectUntil(agentDet, "agent not Ready", func(fs []finding.Finding) bool { return len(fs) == 1 && fs[0].Severity == finding.Critical })
	if fs[0].Target != "node-agent/calico-system/calico-node" || fs[0].Evidence["pod"] != "calico-node-n1" || fs[0].Evidence[cluster.EvidenceAgent] != "calico-node" {
		t.Errorf("not ready finding %+v", fs[0])
	}
	fakekubelet.SetStatus(t, admin, "calico-system", "calico-node-n1", fakekubelet.Running(0, nil))
	detectUntil(agentDet, "agent Ready again", none)
	// Restart count rising (no last state): found, clears after the window.
	fakekubelet.SetStatus(t, admin, "calico-system", "calico-node-n1", fakekubelet.Running(2, nil))
	fs = detectUntil(agentDet, "restarts rising", func(fs []finding.Finding) bool { return len(fs) == 1 })
	if !strings.Contains(fs[0].Message, "restarting (2 restarts") || fs[0].Evidence["restartCount"] != int32(2) {
		t.Errorf("restarting finding %+v", fs[0])
	}
	detectUntil(agentDet, "restart window over", none)
	// OOM-killed just now.
	fakekubelet.SetStatus(t, admin, "calico-system", "calico-node-n1", fakekubelet.Running(3, &corev1.ContainerStateTerminated{
		Reason: "OOMKilled", ExitCode: 137, FinishedAt: metav1.NewTime(time.Now())}))
	fs = detectUntil(agentDet, "OOM-killed", func(fs []finding.Finding) bool { return len(fs) == 1 && fs[0].Evidence["oomKilled"] == true })
	if fs[0].Evidence["lastTerminatedReason"] != "OOMKilled" || !strings.Contains(fs[0].Message, "OOM-killed") {
		t.Errorf("oom finding %+v", fs[0])
	}
	detectUntil(agentDet, "OOM window over", none)

	// RestartNodeAgent, enforce, as the ServiceAccount on n1.
	typ, _ := action.Lookup("RestartNodeAgent")
	params := typ.NewParams().(*action.RestartNodeAgentParams)
	params.ReadyTimeout, params.PollInterval = policy.D(20*time.Second), policy.D(200*time.Millisecond)
	a, err := typ.New(params, n)
	if err != nil {
		t.Fatal(err)
	}
	for target, want := range map[string]string{
		"pod/calico-system/calico-node-n2": "no pod calico-system/calico-node-n2 of an allowlisted agent on node n1",
		"pod/" + podsNS + "/batch-00":      "no pod " + podsNS + "/batch-00 of an allowlisted agent",
	} {
		if _, err := a.Execute(ctx, finding.Finding{Target: target, Subject: finding.Subject{Kind: finding.KindPod}}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", target, err, want)
		}
	}
	// The admission policy refuses the same delete server-side in the
	// agents' namespace; RBAC already refuses it outside the agents'
	// namespaces, a pod labelled like an agent included.
	fakekubelet.Create(t, admin, func() *corev1.Pod {
		p := fakekubelet.CalicoNode("calico-system", "impostor", "n1")
		p.Namespace = podsNS
		return p
	}(), fakekubelet.Running(0, nil))
	for _, p := range [][3]string{{"calico-system", "calico-node-n2", "only delete the pod of a node agent"},
		{podsNS, "batch-00", `cannot delete resource "pods"`}, {podsNS, "impostor", `cannot delete resource "pods"`}} {
		err := c.Interface.CoreV1().Pods(p[0]).Delete(ctx, p[1], metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), p[2]) {
			t.Errorf("delete %s/%s as the daemon on n1: %v, want %q", p[0], p[1], err, p[2])
		}
	}
	go func() { // the DaemonSet controller
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := admin.CoreV1().Pods("calico-system").Get(ctx, "calico-node-n1", metav1.GetOptions{}); apierrors.IsNotFound(err) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		p, err := admin.CoreV1().Pods("calico-system").Create(ctx, fakekubelet.CalicoNode("calico-system", "calico-node-n1-new", "n1"), metav1.CreateOptions{})
		if err == nil {
			p.Status = fakekubelet.Running(0, nil)
			_, _ = admin.CoreV1().Pods("calico-system").UpdateStatus(ctx, p, metav1.UpdateOptions{})
		}
	}()
	res, err := a.Execute(ctx, finding.Finding{Target: "pod/calico-system/calico-node-n1", Subject: finding.Subject{Kind: finding.KindPod}})
	if err != nil || res.Details["newPod"] != "calico-node-n1-new" {
		t.Fatalf("restart: %+v %v", res, err)
	}
	if _, err := admin.CoreV1().Pods("calico-system").Get(ctx, "calico-node-n1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("old agent pod still there: %v", err)
	}
	if _, err := admin.CoreV1().Pods("calico-system").Get(ctx, "calico-node-n2", metav1.GetOptions{}); err != nil {
		t.Errorf("n2's agent pod: %v", err)
	}

	// Every pod request the watch made was field-selected to n1 (no
	// cluster-wide pod list); the action's lists are too.
	mu.Lock()
	defer mu.Unlock()
	lists := 0
	for _, u := range urls {
		if strings.HasPrefix(u, "GET ") {
			lists++
			if !strings.Contains(u, "fieldSelector=spec.nodeName%3Dn1") {
				t.Errorf("pod request without the node's field selector: %s", u)
			}
		}
	}
	if lists == 0 {
		t.Error("no pod list/watch recorded")
	}
	for _, ns := range []string{podsNS, "calico-system"} {
		_ = admin.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	}
}
