package realnode_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/remediate-dev/remediate/internal/testing/realnode"
)

// Scenario (i) of the lane (issue 37, point 2): kube-proxy run as a static
// pod, as RKE2 and kubeadm-era clusters run it. The kubelet runs it from
// its staticPodPath (realnode's StaticPodDir) and the API has only its
// mirror pod (owned by the Node, annotation kubernetes.io/config.mirror),
// whose deletion restarts nothing. Frozen (SIGSTOP, as in (f)), it is
// identified by its cgroup as the static pod (procident's ShapeStaticPod);
// restart-frozen-kube-proxy does not delete the mirror, and the finding
// says why and what the operator should do (procident's RestartHow).

const (
	// laneNoNodeLabel is a node label no node has: the DaemonSet's
	// nodeSelector during (i), which takes its pod off the node.
	laneNoNodeLabel = "remediate.dev/lane-no-kube-proxy"
	staticManifest  = "kube-proxy.json"
)

// kubeProxyOffNode patches the kube-proxy DaemonSet's nodeSelector (on:
// a label no node has, so its controller deletes the pod; off: none, as
// the lane deployed it).
func kubeProxyOffNode(ctx context.Context, n *realnode.Node, off bool) error {
	sel := "null"
	if off {
		sel = fmt.Sprintf(`{%q: "true"}`, laneNoNodeLabel)
	}
	patch := fmt.Sprintf(`{"spec":{"template":{"spec":{"nodeSelector":%s}}}}`, sel)
	_, err := n.Client.AppsV1().DaemonSets("kube-system").Patch(ctx, "kube-proxy", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// kubeProxyPods are the pods labelled k8s-app=kube-proxy, one line each.
func kubeProxyPods(ctx context.Context, n *realnode.Node) ([]corev1.Pod, string) {
	pods, err := n.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: "k8s-app=kube-proxy"})
	if err != nil {
		return nil, err.Error()
	}
	msg := ""
	for _, p := range pods.Items {
		owner := "none"
		if c := metav1.GetControllerOf(&p); c != nil {
			owner = c.Kind + "/" + c.Name
		}
		msg += fmt.Sprintf("%s owner=%s %s deleting=%v; ", p.Name, owner, p.Status.Phase, p.DeletionTimestamp != nil)
	}
	return pods.Items, msg
}

func staticKubeProxy(t *testing.T, n *realnode.Node) {
	ctx := context.Background()
	const rule = "restart-frozen-kube-proxy"
	mirrorName := realnode.KubeProxyStaticPodName + "-" + realnode.NodeName
	manifest := filepath.Join(n.StaticPodDir, staticManifest)

	// Restored whatever happens: the static pod's manifest removed (the
	// kubelet stops it and deletes its mirror), then the DaemonSet back
	// on the node and its pod Ready, as the scenarios after this need.
	t.Cleanup(func() {
		ctx := context.Background()
		t0 := time.Now()
		if err := os.Remove(manifest); err != nil && !os.IsNotExist(err) {
			t.Errorf("removing the static pod's manifest: %v", err)
		}
		if err := n.Poll(ctx, "the static kube-proxy's mirror pod gone", 2*time.Minute, func(ctx context.Context) (bool, string) {
			_, err := n.Client.CoreV1().Pods("kube-system").Get(ctx, mirrorName, metav1.GetOptions{})
			return err != nil, fmt.Sprint(err)
		}); err != nil {
			t.Error(err)
		}
		if err := kubeProxyOffNode(ctx, n, false); err != nil {
			t.Errorf("restoring kube-proxy's DaemonSet: %v", err)
		}
		if err := n.Poll(ctx, "kube-proxy's DaemonSet pod Ready again", 3*time.Minute, func(ctx context.Context) (bool, string) {
			pods, msg := kubeProxyPods(ctx, n)
			ready, rmsg := n.PodsReady(ctx, "kube-system", "k8s-app=kube-proxy")
			return ready && len(pods) == 1 && metav1.GetControllerOf(&pods[0]) != nil && metav1.GetControllerOf(&pods[0]).Kind == "DaemonSet", msg + rmsg
		}); err != nil {
			t.Error(err)
		}
		t.Logf("restored (static pod gone, DaemonSet pod Ready) in %.0fs", time.Since(t0).Seconds())
	})

	// The DaemonSet's pod off the node (both would bind kube-proxy's
	// ports), and its process gone.
	t0 := time.Now()
	if err := kubeProxyOffNode(ctx, n, true); err != nil {
		t.Fatal(err)
	}
	if err := n.Poll(ctx, "kube-proxy's DaemonSet pod gone from the node", 2*time.Minute, func(ctx context.Context) (bool, string) {
		pods, msg := kubeProxyPods(ctx, n)
		return len(pods) == 0, msg
	}); err != nil {
		t.Fatal(err)
	}
	b, err := n.KubeProxyStaticPod()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(manifest, b, 0o644); err != nil {
		t.Fatal(err)
	}
	var mirror *corev1.Pod
	if err := n.Poll(ctx, "the static kube-proxy's mirror pod Ready", 3*time.Minute, func(ctx context.Context) (bool, string) {
		ready, msg := n.PodsReady(ctx, "kube-system", "k8s-app=kube-proxy")
		p, err := n.Client.CoreV1().Pods("kube-system").Get(ctx, mirrorName, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Sprint(err, msg)
		}
		mirror = p
		return ready, msg
	}); err != nil {
		t.Fatalf("%v\nkubelet log:\n%s", err, realnode.Tail(n.Log("kubelet"), 20))
	}
	c := metav1.GetControllerOf(mirror)
	if _, ok := mirror.Annotations["kubernetes.io/config.mirror"]; !ok || c == nil || c.Kind != "Node" {
		t.Fatalf("pod %s is not a static pod's mirror: annotations %v, controller %+v", mirror.Name, mirror.Annotations, c)
	}
	if err := n.Poll(ctx, "the static kube-proxy's /healthz", 2*time.Minute, func(ctx context.Context) (bool, string) {
		_, err := n.HTTPGet(ctx, "http://127.0.0.1:10256/healthz")
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("static kube-proxy %s (uid %s, config uid %s) Ready, %.0fs after the DaemonSet's pod was taken off the node",
		mirror.Name, mirror.UID, mirror.Annotations["kubernetes.io/config.mirror"], time.Since(t0).Seconds())

	recs0, _ := journalRecords(t, n)
	m, _ := scrape(ctx, n)
	blocks0 := max(metricValue(m, "remediate_guardrail_blocks_total", `rule="`+rule+`"`), 0)
	frozen := freezeKubeProxy(ctx, t, n)
	if frozen.pod.UID != mirror.UID {
		t.Fatalf("froze pod %s (uid %s), not the static kube-proxy's mirror %s", frozen.pod.Name, frozen.pod.UID, mirror.UID)
	}
	t1 := time.Now()
	t.Logf("static kube-proxy pid %d stopped", frozen.pid)

	// The finding: frozen, identified as the static pod, with what the
	// operator should do instead.
	var line string
	if err := n.Poll(ctx, "the "+rule+" finding naming the static pod", 4*time.Minute, func(ctx context.Context) (bool, string) {
		for _, l := range strings.Split(podLog(ctx, n, remediatePod(t, n)), "\n") {
			if strings.Contains(l, `"rule":"`+rule+`"`) && strings.Contains(l, "finding appeared") && strings.Contains(l, mirrorName) {
				line = l
				return true, ""
			}
		}
		m, _ := scrape(ctx, n)
		return false, fmt.Sprintf("findings=%v", metricValue(m, "remediate_findings", `rule="`+rule+`"`))
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("finding %.0fs after the freeze: %s", time.Since(t1).Seconds(), line)
	for _, w := range []string{
		"static pod",                                      // procident's shape (the identity's owner)
		"kube-system/" + mirrorName,                       // the mirror, by the cgroup's config UID
		"not restartable through the API",                 // the finding says it up front
		"deleting its mirror pod restarts nothing",        // why
		"crictl stop",                                     // what the operator does instead
		"move its manifest out of the directory and back", // or that
	} {
		if !strings.Contains(line, w) {
			t.Errorf("the finding lacks %q: %s", w, line)
		}
	}

	// Three more cycles with the finding: the mirror pod untouched, the
	// same process still stopped, nothing journaled for the rule, and no
	// guardrail block (the action refuses at its plan, before any
	// guardrail: the refusal is the shape, not a cooldown).
	m, err = scrape(ctx, n)
	if err != nil {
		t.Fatal(err)
	}
	c0 := metricValue(m, "remediate_cycle_duration_seconds_count")
	if err := n.Poll(ctx, "3 cycles with the finding after it appeared", 3*time.Minute, func(ctx context.Context) (bool, string) {
		m, err := scrape(ctx, n)
		if err != nil {
			return false, err.Error()
		}
		cyc, f := metricValue(m, "remediate_cycle_duration_seconds_count"), metricValue(m, "remediate_findings", `rule="`+rule+`"`)
		return cyc-c0 >= 3 && f > 0, fmt.Sprintf("cycles %v (from %v), findings %v", cyc, c0, f)
	}); err != nil {
		t.Fatal(err)
	}
	now, err := n.Client.CoreV1().Pods("kube-system").Get(ctx, mirrorName, metav1.GetOptions{})
	if err != nil || now.UID != mirror.UID || now.DeletionTimestamp != nil {
		t.Errorf("the mirror pod %s was deleted or replaced: %v %+v", mirrorName, err, now)
	}
	if !frozen.alive() {
		t.Errorf("the stopped static kube-proxy (pid %d) is gone", frozen.pid)
	} else if st, _ := realnode.ProcState(frozen.pid); st != "T" {
		t.Errorf("static kube-proxy pid %d in state %q, want still stopped (T)", frozen.pid, st)
	}
	recs, _ := journalRecords(t, n)
	for _, r := range recs[len(recs0):] {
		if r.Rule == rule {
			b, _ := json.Marshal(r)
			t.Errorf("journaled for the static kube-proxy: %s", b)
		}
	}
	m, _ = scrape(ctx, n)
	if b := max(metricValue(m, "remediate_guardrail_blocks_total", `rule="`+rule+`"`), 0); b != blocks0 {
		t.Errorf("remediate_guardrail_blocks_total{rule=%q} %v -> %v: the action reached the guardrails instead of refusing the static pod at its plan", rule, blocks0, b)
	}
	if !t.Failed() {
		t.Logf("%.0fs after the freeze: mirror %s uid unchanged, pid %d still stopped, nothing journaled for %s", time.Since(t1).Seconds(), mirrorName, frozen.pid, rule)
	}

	frozen.resume()
	if err := n.Poll(ctx, "the static kube-proxy answers again after SIGCONT", time.Minute, func(ctx context.Context) (bool, string) {
		_, err := n.HTTPGet(ctx, "http://127.0.0.1:10256/healthz")
		return err == nil, fmt.Sprint(err)
	}); err != nil {
		t.Fatal(err)
	}
}
