package kube

import (
	"github.com/remediate-dev/remediate/internal/cluster"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestToPod(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "calico-node-x", UID: "u1", CreationTimestamp: metav1.NewTime(t0),
			Labels:          map[string]string{"k8s-app": "calico-node"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "DaemonSet", Name: "calico-node", Controller: ptr.To(true)}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}, Annotations: map[string]string{"big": strings.Repeat("x", 1000)}},
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0.Add(time.Second))},
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: metav1.NewTime(t0.Add(2 * time.Second))},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(t0)},
		},
			InitContainerStatuses: []corev1.ContainerStatus{{Name: "install-cni", Ready: true}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "calico-node", RestartCount: 4,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: strings.Repeat("m", 2000)}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137, FinishedAt: metav1.NewTime(t0.Add(time.Minute))}}}}},
	}
	c := ToPod(p)
	if c.Key() != "kube-system/calico-node-x" || c.UID != "u1" || c.ControllerKind != "DaemonSet" || c.ControllerName != "calico-node" || !c.HostNetwork || c.Phase != "Running" || c.Labels["k8s-app"] != "calico-node" {
		t.Errorf("identity %+v", c)
	}
	if !c.SandboxReady.IsTrue() || !c.Ready.IsFalse() || !c.Ready.Since.Equal(t0.Add(2*time.Second)) || !c.Scheduled.Since.Equal(t0) {
		t.Errorf("conditions %+v %+v %+v", c.SandboxReady, c.Ready, c.Scheduled)
	}
	if len(c.Containers) != 2 || !c.Containers[0].Init || c.Restarts() != 4 {
		t.Fatalf("containers %+v", c.Containers)
	}
	m := c.Containers[1]
	if m.WaitingReason != "CrashLoopBackOff" || len(m.WaitingMessage) > maxWaitingMessage+32 || m.LastTerminatedReason != "OOMKilled" ||
		m.LastTerminatedExitCode != 137 || !m.LastTerminatedAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("container %+v", m)
	}
	// The store keeps the compact record, not the object.
	rec, err := TransformPod(p)
	if err != nil {
		t.Fatal(err)
	}
	if cp, ok := rec.(*compactPod); !ok || cp.name != "calico-node-x" {
		t.Fatalf("record %T", rec)
	}
	if again, _ := TransformPod(rec); again != rec {
		t.Error("a record is transformed again")
	}
	p.DeletionTimestamp = ptr.To(metav1.NewTime(t0))
	if !ToPod(p).Terminating {
		t.Error("deletionTimestamp not seen")
	}
	if c.MirrorOf != "" {
		t.Errorf("a DaemonSet's pod taken for a mirror: %q", c.MirrorOf)
	}
	// A static pod's mirror: the kubelet runs it (and names its cgroup)
	// with the UID its annotation carries, not the mirror's.
	p.Annotations = map[string]string{"kubernetes.io/config.mirror": "0123456789abcdef0123456789abcdef", "kubernetes.io/config.hash": "0123456789abcdef0123456789abcdef"}
	if got := ToPod(p).MirrorOf; got != "0123456789abcdef0123456789abcdef" {
		t.Errorf("mirror of %q", got)
	}
	p.Annotations["kubernetes.io/config.mirror"] = strings.Repeat("f", 65)
	if got := ToPod(p).MirrorOf; got != "" {
		t.Errorf("an oversized annotation kept: %q", got)
	}
}

func TestToPodHostPorts(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "web", Ports: []corev1.ContainerPort{{ContainerPort: 80, HostPort: 8080}, {ContainerPort: 9090}}},
			{Name: "dns", Ports: []corev1.ContainerPort{{ContainerPort: 53, HostPort: 5353, Protocol: corev1.ProtocolUDP, HostIP: "192.0.2.10"}}},
		}},
		Status: corev1.PodStatus{PodIP: "10.244.0.5", PodIPs: []corev1.PodIP{{IP: "10.244.0.5"}, {IP: "fd00::5"}}},
	}
	c := ToPod(p)
	if len(c.IPs) != 2 || c.IPs[1] != "fd00::5" {
		t.Errorf("IPs %v", c.IPs)
	}
	want := []cluster.HostPort{{Container: "web", HostPort: 8080, ContainerPort: 80, Protocol: "TCP"},
		{Container: "dns", HostPort: 5353, ContainerPort: 53, Protocol: "UDP", HostIP: "192.0.2.10"}}
	if len(c.HostPorts) != 2 || c.HostPorts[0] != want[0] || c.HostPorts[1] != want[1] {
		t.Errorf("HostPorts %+v, want %+v", c.HostPorts, want)
	}
	p.Status.PodIPs = nil
	if c := ToPod(p); len(c.IPs) != 1 || c.IPs[0] != "10.244.0.5" {
		t.Errorf("PodIP only: %v", c.IPs)
	}
}
