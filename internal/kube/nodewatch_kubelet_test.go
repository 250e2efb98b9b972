package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/remediate-dev/remediate/internal/kubelet"
)

// TestNodeWatchKeepsKubeletAddress: the stripped Node the watch keeps
// still gives the kubelet's address and port (the daemon's kubelet scrape
// resolves them from it); without them every scrape was "no address".
func TestNodeWatchKeepsKubeletAddress(t *testing.T) {
	cs := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rn1"}, Status: corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "rn1"}, {Type: corev1.NodeInternalIP, Address: "10.232.0.1"}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		Images:          []corev1.ContainerImage{{Names: []string{"a-big-list"}}}}})
	w := NewNodeWatch(cs, "rn1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	w.Start(ctx)
	if !w.WaitForSync(ctx) {
		t.Fatal("not synced")
	}
	n, ok := w.Node()
	if !ok {
		t.Fatal("no node")
	}
	host, port, err := kubelet.NodeAddress(n)
	if err != nil || host != "10.232.0.1" || port != 10250 {
		t.Fatalf("kubelet address %s:%d %v", host, port, err)
	}
	if len(n.Status.Images) != 0 || len(n.Status.Addresses) != 1 {
		t.Errorf("kept more than the addresses: %+v", n.Status)
	}
}
