package action

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

func hostPortAppPod(name, nodeName string, uid types.UID, ip string, owner string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "app", UID: uid},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "web",
			Ports: []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	if owner != "" {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: owner, Name: "web-rs", Controller: ptr.To(true), APIVersion: "apps/v1", UID: "rs"}}
	}
	return p
}

// portmapNAT is the nat table with portmap's DNAT of hostPort 8080 to ip:80.
func portmapNAT(ip string) string {
	return fmt.Sprintf(`*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:CNI-DN-abc - [0:0]
:CNI-HOSTPORT-DNAT - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT
-A CNI-DN-abc -p tcp -m tcp --dport 8080 -j DNAT --to-destination %s:80
-A CNI-HOSTPORT-DNAT -p tcp -m multiport --dports 8080 -j CNI-DN-abc
COMMIT
`, ip)
}

func newRecreate(t *testing.T, n *node.Node, timeout time.Duration) Action {
	t.Helper()
	typ, ok := Lookup("RecreateHostPortPod")
	if !ok {
		t.Fatal("RecreateHostPortPod not registered")
	}
	if !typ.Disruptive {
		t.Error("RecreateHostPortPod must take a cluster budget slot (Disruptive)")
	}
	p := typ.NewParams().(*RecreateHostPortPodParams)
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatalf("defaults invalid: %v", errs)
	}
	p.VerifyTimeout, p.PollInterval = policy.D(timeout), policy.D(20*time.Millisecond)
	a, err := typ.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestRecreateHostPortPodRefusals(t *testing.T) {
	ctx := context.Background()
	mirror := hostPortAppPod("static-n1", "n1", "m", "10.244.0.9", "Node")
	mirror.Annotations = map[string]string{"kubernetes.io/config.mirror": "abc"}
	noPorts := hostPortAppPod("plain", "n1", "p", "10.244.0.8", "ReplicaSet")
	noPorts.Spec.Containers[0].Ports = nil
	cs := fake.NewClientset(
		hostPortAppPod("bare", "n1", "b", "10.244.0.7", ""),
		hostPortAppPod("elsewhere", "n2", "e", "10.244.1.5", "ReplicaSet"),
		hostPortAppPod("web-1", "n1", "w", "10.244.0.5", "ReplicaSet"),
		mirror, noPorts,
	)
	// The chart grants list and watch on pods, not get (deploy/.../rbac.yaml).
	cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New("no get in the chart's ClusterRole"))
	})
	a := newRecreate(t, &node.Node{Name: "n1", Kube: cs}, time.Second)
	for _, tc := range []struct {
		target, uid, err, skip string
	}{
		{target: "pod/app/bare", err: "is a bare pod (no controller): deleting it would remove it for good"},
		{target: "pod/app/elsewhere", err: `runs on node "n2"`},
		{target: "pod/app/static-n1", err: "static pod's mirror"},
		{target: "pod/app/plain", err: "has no container port with a hostPort"},
		{target: "pod/app/gone", skip: "is gone"},
		{target: "pod/app/web-1", uid: "old", skip: "replaced since"},
		{target: "iptables/IPv4/kube-chains-absent", err: "not a pod target"},
	} {
		f := finding.Finding{Target: tc.target, Subject: finding.Subject{Kind: finding.KindPod, Pod: &finding.Pod{UID: tc.uid}}}
		_, err := a.Plan(ctx, f)
		reason, skipped := finding.IsSkip(err)
		switch {
		case err == nil:
			t.Errorf("%s: planned", tc.target)
		case tc.skip != "" && (!skipped || !strings.Contains(reason, tc.skip)):
			t.Errorf("%s: %v, want skip %q", tc.target, err, tc.skip)
		case tc.err != "" && (skipped || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want refusal %q", tc.target, err, tc.err)
		}
	}
	// Nothing was deleted by a refusal.
	if l, _ := cs.CoreV1().Pods("app").List(ctx, metav1.ListOptions{}); len(l.Items) != 5 {
		t.Errorf("%d pods left, want 5", len(l.Items))
	}
	pl, err := a.Plan(ctx, finding.Finding{Target: "pod/app/web-1", Subject: finding.Subject{Kind: finding.KindPod, Pod: &finding.Pod{UID: "w"}}})
	if err != nil || !strings.Contains(pl.Summary, "delete pod app/web-1 (uid w, ReplicaSet web-rs)") {
		t.Errorf("plan: %+v %v", pl, err)
	}
}

// replicaSetController stands in for the ReplicaSet controller: when app
// has no pod of web-rs left, it creates a Ready one on n1 with ip.
func replicaSetController(t *testing.T, cs *fake.Clientset, ip string) {
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
			if l, _ := cs.CoreV1().Pods("app").List(ctx, metav1.ListOptions{}); len(l.Items) == 0 {
				_, _ = cs.CoreV1().Pods("app").Create(ctx, hostPortAppPod(fmt.Sprintf("web-new-%d", k), "n1", types.UID(fmt.Sprint("new", k)), ip, "ReplicaSet"), metav1.CreateOptions{})
			}
		}
	}()
	t.Cleanup(func() { close(quit); <-done })
}

func TestRecreateHostPortPodExecute(t *testing.T) {
	ctx := context.Background()
	f := finding.Finding{Target: "pod/app/web-1", Subject: finding.Subject{Kind: finding.KindPod, Pod: &finding.Pod{UID: "w"}}}

	// The new sandbox gets its DNAT (portmap ran at its CNI ADD).
	cs := fake.NewClientset(hostPortAppPod("web-1", "n1", "w", "10.244.0.5", "ReplicaSet"))
	ipt := iptables.NewFake()
	ipt.SetRules(iptables.IPv4, iptables.Legacy, portmapNAT("10.244.0.6"))
	replicaSetController(t, cs, "10.244.0.6")
	a := newRecreate(t, &node.Node{Name: "n1", Kube: cs, IPTables: ipt}, 5*time.Second)
	res, err := a.Execute(ctx, f)
	if err != nil {
		t.Fatalf("execute: %v (%+v)", err, res)
	}
	if !strings.Contains(res.Summary, "its hostPort DNAT (8080/TCP->80) back") || res.Details["oldUID"] != "w" || res.Details["dnatBackAfter"] == nil {
		t.Errorf("result %+v", res)
	}

	// The replacement is Ready but its DNAT never shows: the bounded wait
	// ends in an error naming what is missing.
	cs2 := fake.NewClientset(hostPortAppPod("web-1", "n1", "w", "10.244.0.5", "ReplicaSet"))
	ipt2 := iptables.NewFake()
	ipt2.SetRules(iptables.IPv4, iptables.Legacy, portmapNAT("10.244.0.99"))
	replicaSetController(t, cs2, "10.244.0.7")
	a2 := newRecreate(t, &node.Node{Name: "n1", Kube: cs2, IPTables: ipt2}, 300*time.Millisecond)
	res, err = a2.Execute(ctx, f)
	if err == nil || !strings.Contains(err.Error(), "missing IPv4 8080/TCP -> 10.244.0.7:80") {
		t.Fatalf("no DNAT: %v (%+v)", err, res)
	}
	if _, gone := cs2.CoreV1().Pods("app").Get(ctx, "web-1", metav1.GetOptions{}); gone == nil {
		t.Error("old pod not deleted")
	}
}
