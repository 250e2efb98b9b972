package kube

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// TestViewMemoryBudget: a slice that would take the view past its budget
// is held empty, the view says so naming the budget, and once it is gone
// (deleted, or replaced by one that fits) the view is whole again.
func TestViewMemoryBudget(t *testing.T) {
	small := testSlice("small", "10.0.0.1")
	addrs := make([]string, 200)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.1.%d.%d", i>>8, i&255)
	}
	big := testSlice("big", addrs...) // 200 endpoints: > 40 KB estimated
	cs := fake.NewClientset(testService(), small)
	v, err := NewLimitedView(cs, nil, nil, nil, ViewLimits{MemoryBudget: 16 << 10, BudgetName: "memory budget (--cluster-view-memory 16Ki)"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v.Start(ctx)
	if !v.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	if f := v.Freshness(); f.OverBudget != "" {
		t.Fatalf("over budget with one small slice: %s", f.OverBudget)
	}
	before := v.Budget()
	if before.Bytes <= 0 || before.Bytes > 16<<10 || before.Dropped != 0 {
		t.Fatalf("budget state %+v", before)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("kube-system").Create(ctx, big, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the big slice, held empty", func() bool { return v.Budget().Dropped == 1 && storeHas(v.eps, "kube-system/big") })
	f := v.Freshness()
	if !strings.Contains(f.OverBudget, "--cluster-view-memory 16Ki") || !strings.Contains(f.OverBudget, "1 Services/EndpointSlices are not held") {
		t.Errorf("OverBudget = %q", f.OverBudget)
	}
	if _, skip := f.Usable(time.Now()); skip != f.OverBudget {
		t.Errorf("Usable skip %q, want the budget's reason", skip)
	}
	if eps := v.Endpoints("kube-system", "dns"); len(eps) != 1 || eps[0].Address != "10.0.0.1" {
		t.Errorf("endpoints %+v: the big slice's must not be held", eps)
	}
	if st := v.Budget(); st.Bytes != before.Bytes {
		t.Errorf("held %d bytes after the refusal, want %d as before", st.Bytes, before.Bytes)
	}
	// A record transformed again (the streaming list replaces its initial
	// store into the queue) keeps its accounting: the empty one stays
	// dropped.
	o, _, _ := v.eps.GetStore().GetByKey("kube-system/big")
	if _, err := v.transform(o); err != nil || v.Budget().Dropped != 1 || v.Freshness().OverBudget == "" {
		t.Errorf("after transforming the held record again: %+v, %q", v.Budget(), v.Freshness().OverBudget)
	}
	// Replaced by a slice that fits: whole again.
	big.Endpoints = big.Endpoints[:1]
	if _, err := cs.DiscoveryV1().EndpointSlices("kube-system").Update(ctx, big, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shrunk slice held", func() bool { return v.Budget().Dropped == 0 && len(v.Endpoints("kube-system", "dns")) == 2 })
	if f := v.Freshness(); f.OverBudget != "" {
		t.Errorf("still over budget: %s", f.OverBudget)
	}
	// Grown again, then deleted: the deletion settles the account.
	big.Endpoints = testSlice("big", addrs...).Endpoints
	if _, err := cs.DiscoveryV1().EndpointSlices("kube-system").Update(ctx, big, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the grown slice dropped", func() bool { return v.Budget().Dropped == 1 })
	if err := cs.DiscoveryV1().EndpointSlices("kube-system").Delete(ctx, "big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion settled", func() bool { return v.Budget().Dropped == 0 && !storeHas(v.eps, "kube-system/big") })
	if st := v.Budget(); st.Bytes != before.Bytes || v.Freshness().OverBudget != "" {
		t.Errorf("after the deletion: %+v (want %d bytes), %q", st, before.Bytes, v.Freshness().OverBudget)
	}
}

// TestViewNoBudget: a negative budget holds everything.
func TestViewNoBudget(t *testing.T) {
	addrs := make([]string, 200)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.1.%d.%d", i>>8, i&255)
	}
	cs := fake.NewClientset(testService(), testSlice("big", addrs...))
	v, err := NewLimitedView(cs, nil, nil, nil, ViewLimits{MemoryBudget: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	v.Start(ctx)
	if !v.WaitForSync(ctx) {
		t.Fatal("no sync")
	}
	if n := len(v.Endpoints("kube-system", "dns")); n != 200 || v.Freshness().OverBudget != "" {
		t.Errorf("%d endpoints, %q", n, v.Freshness().OverBudget)
	}
}

// TestViewFreshnessAge: a disconnected view is as old as the API server's
// last answer, and carries its maximum age.
func TestViewFreshnessAge(t *testing.T) {
	cs := fake.NewClientset(testService())
	contact := &Contact{}
	contact.record(nil)
	v, err := NewLimitedView(cs, contact, nil, nil, ViewLimits{MaxAge: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ok := contact.Snapshot().LastOK
	f := v.Freshness()
	if !f.Connected || f.MaxAge != time.Minute || f.CurrentAt.Before(ok) {
		t.Fatalf("connected: %+v", f)
	}
	contact.record(fmt.Errorf("GET /api/v1/services: HTTP 429"))
	f = v.Freshness()
	if f.Connected || !f.CurrentAt.Equal(ok) {
		t.Fatalf("after a 429: %+v, want CurrentAt %s", f, ok)
	}
	f.Synced = true // as after the initial list
	if note, skip := f.Usable(ok.Add(30 * time.Second)); skip != "" || !strings.Contains(note, "30s old") {
		t.Errorf("30 s later: note %q skip %q", note, skip)
	}
	if _, skip := f.Usable(ok.Add(2 * time.Minute)); !strings.Contains(skip, "older than its 1m0s limit") {
		t.Errorf("2 min later: skip %q", skip)
	}
}

func storeHas(inf cache.SharedIndexInformer, key string) bool {
	_, ok, _ := inf.GetStore().GetByKey(key)
	return ok
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
