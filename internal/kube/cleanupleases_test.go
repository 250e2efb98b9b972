package kube

import (
	"context"
	"sort"
	"testing"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestCleanupLeases: an uninstall deletes the daemons' own Leases (budget
// slots, node storm status) in the namespace it is given, and nothing else:
// not another component's Lease there, not remediate's names elsewhere.
func TestCleanupLeases(t *testing.T) {
	lease := func(ns, name string) *coordv1.Lease {
		return &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	cs := fake.NewSimpleClientset(
		lease("remediate", "remediate-node-rn1"),
		lease("remediate", "remediate-budget-0"),
		lease("remediate", "remediate-budget-1"),
		lease("remediate", "kube-scheduler"),
		lease("remediate", "remediate-nodes"), // not a prefix of ours: "remediate-node-"
		lease("kube-system", "remediate-node-rn1"),
	)
	ctx := context.Background()
	did, err := CleanupLeases(ctx, cs, "remediate")
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(did)
	if want := []string{"remediate-budget-0", "remediate-budget-1", "remediate-node-rn1"}; len(did) != 3 || did[0] != want[0] || did[1] != want[1] || did[2] != want[2] {
		t.Errorf("deleted %v, want %v", did, want)
	}
	left, _ := cs.CoordinationV1().Leases("remediate").List(ctx, metav1.ListOptions{})
	var names []string
	for _, l := range left.Items {
		names = append(names, l.Name)
	}
	sort.Strings(names)
	if len(names) != 2 || names[0] != "kube-scheduler" || names[1] != "remediate-nodes" {
		t.Errorf("left %v, want [kube-scheduler remediate-nodes]", names)
	}
	if _, err := cs.CoordinationV1().Leases("kube-system").Get(ctx, "remediate-node-rn1", metav1.GetOptions{}); err != nil {
		t.Errorf("a Lease of another namespace was touched: %v", err)
	}
	// Again: nothing left to delete, no error.
	if did, err := CleanupLeases(ctx, cs, "remediate"); err != nil || len(did) != 0 {
		t.Errorf("second run: %v, %v", did, err)
	}
}
