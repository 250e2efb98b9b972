// Package fakekubelet writes pods as a kubelet would, for tests against the
// real kube-apiserver (internal/testing/controlplane), where no kubelet
// runs: a pod created with spec.nodeName is bound at once, and its status
// is whatever is written through the status subresource; nothing
// overwrites it.
package fakekubelet

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Workload is a pod of one container bound to nodeName, deleted at once
// (grace period 0; no kubelet would confirm a graceful delete).
func Workload(ns, name, nodeName string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "web", Image: "registry.k8s.io/pause:3.10"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0)},
	}
}

// CalicoNode is a calico-node pod (the label CNIAgentUnhealthy's default
// selector matches) on nodeName, controlled by DaemonSet calico-node.
func CalicoNode(ns, name, nodeName string) *corev1.Pod {
	p := Workload(ns, name, nodeName)
	p.Labels = map[string]string{"k8s-app": "calico-node"}
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "calico-node", UID: types.UID("calico-ds"), Controller: ptr.To(true)}}
	p.Spec.Containers[0].Name = "calico-node"
	return p
}

// SandboxNotReady is what a kubelet writes while the CNI plugin fails to
// set up the pod's network: PodReadyToStartContainers False since since,
// the container waiting in ContainerCreating with the CNI error.
func SandboxNotReady(since time.Time) corev1.PodStatus {
	t := metav1.NewTime(since)
	return corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, LastTransitionTime: t},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: t},
		{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: t, Reason: "ContainersNotReady"},
	}, ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Image: "registry.k8s.io/pause:3.10",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating",
			Message: `Failed to create pod sandbox: plugin type="calico" failed (add): timeout`}}}}}
}

// Running is a Running, Ready pod (since an hour ago) whose container has
// restarted restarts times, its last run ended as last (may be nil).
func Running(restarts int32, last *corev1.ContainerStateTerminated) corev1.PodStatus {
	t := metav1.NewTime(time.Now().Add(-time.Hour))
	st := corev1.ContainerStatus{Name: "c", Image: "registry.k8s.io/pause:3.10", Ready: true, RestartCount: restarts,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: t}}}
	if last != nil {
		st.LastTerminationState.Terminated = last
	}
	return corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
		{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: t},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: t},
	}, ContainerStatuses: []corev1.ContainerStatus{st}}
}

// NotReady is Running whose Ready condition turned False at since.
func NotReady(since time.Time, restarts int32, last *corev1.ContainerStateTerminated) corev1.PodStatus {
	st := Running(restarts, last)
	st.Conditions[1] = corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(since)}
	st.ContainerStatuses[0].Ready = false
	return st
}

// Create creates p and writes its status st; it returns the pod as
// written.
func Create(t testing.TB, cs kubernetes.Interface, p *corev1.Pod, st corev1.PodStatus) *corev1.Pod {
	t.Helper()
	created, err := cs.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return SetStatus(t, cs, created.Namespace, created.Name, st)
}

// SetStatus writes a pod's status through the status subresource, as the
// kubelet does (container statuses take the name of the pod's first
// container), and returns the pod as written.
func SetStatus(t testing.TB, cs kubernetes.Interface, ns, name string, st corev1.PodStatus) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range st.ContainerStatuses {
		st.ContainerStatuses[i].Name = p.Spec.Containers[0].Name
	}
	p.Status = st
	out, err := cs.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
