package realnode_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/testing/realnode"
)

// Scenario (h) of the lane (issue 37, point 1): a firewall flush as
// firewalld's reload with FlushAllOnReload does it (every chain of the
// nat, mangle and filter tables of both iptables backends flushed and
// deleted). kube-proxy rebuilds its own
// chains from its canary; the hostPort DNAT the CNI portmap plugin wrote
// when the pod's sandbox was created is not rebuilt by anyone, and
// HostPorts (rule host-ports) names the pod, hostPort, protocol and
// family. In audit the pod is left alone.

const (
	hostPortsRule   = "host-ports"
	hostPortsDeploy = "lane-hostport"
	laneHostPort    = 18080
	laneCtrPort     = 8080
)

// natSaves is the nat table of both iptables backends of the node.
func natSaves(t *testing.T, n *realnode.Node) string {
	t.Helper()
	var b strings.Builder
	for _, save := range []string{"iptables-legacy-save", "iptables-nft-save"} {
		out, err := run(t, n, 30*time.Second, save, "-t", "nat")
		if err != nil {
			t.Logf("%s: %v", save, err)
		}
		b.WriteString(out)
	}
	return b.String()
}

// flushAll flushes and deletes every chain of the nat, mangle and filter
// tables of both backends and both families, as firewalld's reload with
// FlushAllOnReload does. The mangle table matters: kube-proxy watches its
// KUBE-PROXY-CANARY chain there (the first of its canary tables) and
// resyncs everything when it is gone; a flush of nat alone leaves
// kube-proxy's PREROUTING jump missing until its hourly full sync.
func flushAll(t *testing.T, n *realnode.Node) {
	t.Helper()
	for _, bin := range []string{"iptables-legacy", "iptables-nft", "ip6tables-legacy", "ip6tables-nft"} {
		for _, table := range []string{"nat", "mangle", "filter"} {
			for _, op := range []string{"-F", "-X"} {
				if out, err := run(t, n, 30*time.Second, bin, "-w", "5", "-t", table, op); err != nil {
					t.Logf("%s -t %s %s: %v %s", bin, table, op, err, out)
				}
			}
		}
	}
}

// hostPortPod returns the running pod of the scenario's Deployment.
func hostPortPod(ctx context.Context, n *realnode.Node) (*corev1.Pod, string) {
	pods, err := n.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + hostPortsDeploy})
	if err != nil {
		return nil, err.Error()
	}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" {
			return p, ""
		}
	}
	return nil, fmt.Sprintf("%d pods, none running with an IP", len(pods.Items))
}

func startHostPortDeployment(t *testing.T, n *realnode.Node) {
	t.Helper()
	ctx := context.Background()
	labels := map[string]string{"app": hostPortsDeploy}
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: hostPortsDeploy, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To[int32](1),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "web", Image: realnode.BusyboxImage, ImagePullPolicy: corev1.PullNever,
						Command: []string{"/bin/sh", "-c", "exec sleep 100000"},
						Ports:   []corev1.ContainerPort{{Name: "web", ContainerPort: laneCtrPort, HostPort: laneHostPort, Protocol: corev1.ProtocolTCP}},
					}},
				},
			},
		},
	}
	if _, err := n.Client.AppsV1().Deployments("default").Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = n.Client.AppsV1().Deployments("default").Delete(ctx, hostPortsDeploy, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationForeground)})
		_ = n.Poll(ctx, hostPortsDeploy+" pods gone", 2*time.Minute, func(ctx context.Context) (bool, string) {
			pods, err := n.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=" + hostPortsDeploy})
			return err == nil && len(pods.Items) == 0, fmt.Sprint(err)
		})
	})
}

// hostPortFindingLine is the daemon's "finding appeared" log line of
// host-ports for pod, "" when there is none.
func hostPortFindingLine(logs string, pod *corev1.Pod) string {
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, `"rule":"`+hostPortsRule+`"`) && strings.Contains(l, `"target":"pod/default/`+pod.Name+`"`) {
			return l
		}
	}
	return ""
}

func hostPortsAudit(t *testing.T, n *realnode.Node) {
	ctx := context.Background()
	startHostPortDeployment(t, n)
	var pod *corev1.Pod
	if err := n.Poll(ctx, hostPortsDeploy+" running", 3*time.Minute, func(ctx context.Context) (bool, string) {
		var msg string
		pod, msg = hostPortPod(ctx, n)
		return pod != nil, msg
	}); err != nil {
		t.Fatal(err)
	}
	dnat := fmt.Sprintf("--to-destination %s:%d", pod.Status.PodIP, laneCtrPort)
	if err := n.Poll(ctx, "portmap's DNAT "+dnat, time.Minute, func(ctx context.Context) (bool, string) {
		s := natSaves(t, n)
		return strings.Contains(s, dnat) && strings.Contains(s, "CNI-HOSTPORT-DNAT"), lastLines(s, 5)
	}); err != nil {
		t.Fatal(err)
	}
	// Two cycles (interval 15s) with the DNAT in place: no finding for the
	// pod (the negative half), and the detector has seen portmap's chains.
	time.Sleep(35 * time.Second)
	if l := hostPortFindingLine(podLog(ctx, n, remediatePod(t, n)), pod); l != "" {
		t.Fatalf("host-ports finding while the DNAT is in place: %s", l)
	}

	flushAll(t, n)
	t0 := time.Now()
	if s := natSaves(t, n); strings.Contains(s, dnat) {
		t.Fatalf("DNAT still there after the flush:\n%s", s)
	}
	// kube-proxy rebuilds its own chains (its canary, every syncPeriod);
	// portmap's stay gone.
	if err := n.Poll(ctx, "kube-proxy's nat KUBE-SERVICES rebuilt", 3*time.Minute, func(ctx context.Context) (bool, string) {
		s := natSaves(t, n)
		return strings.Contains(s, "-A PREROUTING") && strings.Contains(s, "KUBE-SERVICES"), lastLines(s, 3)
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-proxy's chains rebuilt %.0fs after the flush", time.Since(t0).Seconds())
	if s := natSaves(t, n); strings.Contains(s, dnat) || strings.Contains(s, "CNI-HOSTPORT-DNAT") {
		t.Fatalf("portmap's rules came back by themselves; the scenario proves nothing:\n%s", s)
	}

	var line string
	if err := n.Poll(ctx, "the host-ports finding for "+pod.Name, 3*time.Minute, func(ctx context.Context) (bool, string) {
		line = hostPortFindingLine(podLog(ctx, n, remediatePod(t, n)), pod)
		m, _ := scrape(ctx, n)
		return line != "", fmt.Sprintf("findings=%v", metricValue(m, "remediate_findings", `rule="`+hostPortsRule+`"`))
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("finding %.0fs after the flush: %s", time.Since(t0).Seconds(), line)
	want := fmt.Sprintf("IPv4 %d/TCP -> %s:%d", laneHostPort, pod.Status.PodIP, laneCtrPort)
	for _, w := range []string{want, `"severity":"critical"`, "ReplicaSet"} {
		if !strings.Contains(line, w) {
			t.Errorf("finding lacks %q: %s", w, line)
		}
	}
	// Audit: the pod is left alone.
	cur, err := n.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || cur.UID != pod.UID || cur.DeletionTimestamp != nil {
		t.Errorf("audit touched the pod: %v %+v", err, cur.ObjectMeta)
	}
}
