package detect

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
)

// TestClusterViewAge: with the API server unreachable, a check that
// compares the node with the cluster view keeps running on the view it
// has while it is younger than its maximum age, and its findings and
// figure say how old it is; older, it skips saying so.
func TestClusterViewAge(t *testing.T) {
	boom := errors.New("GET /api/v1/nodes/n1: HTTP 429")
	t.Run("young", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		w.view.SetFreshness(cluster.Freshness{Synced: true, LastError: boom, CurrentAt: time.Now().Add(-30 * time.Second), MaxAge: 2 * time.Minute})
		fs, err := newIPVSDetector(t, "IPVSStaleRealServer", w.node, nil).Detect(context.Background())
		if err != nil || len(fs) == 0 {
			t.Fatalf("findings %v, err %v: a young view must be used", fs, err)
		}
		for _, f := range fs {
			note, _ := f.Evidence[EvidenceClusterView].(string)
			if !strings.HasPrefix(note, "cluster view 30s old (API server unreachable: GET /api/v1/nodes/n1: HTTP 429; used up to 2m0s)") {
				t.Errorf("%s: evidence %s = %q", f.Target, EvidenceClusterView, note)
			}
		}
	})
	t.Run("connected", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		fs, err := newIPVSDetector(t, "IPVSStaleRealServer", w.node, nil).Detect(context.Background())
		if err != nil || len(fs) == 0 {
			t.Fatalf("findings %v, err %v", fs, err)
		}
		for _, f := range fs {
			if _, ok := f.Evidence[EvidenceClusterView]; ok {
				t.Errorf("%s: view age on a connected view: %v", f.Target, f.Evidence)
			}
		}
	})
	t.Run("too old", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		w.view.SetFreshness(cluster.Freshness{Synced: true, LastError: boom, CurrentAt: time.Now().Add(-3 * time.Minute), MaxAge: 2 * time.Minute})
		_, err := newIPVSDetector(t, "IPVSStaleRealServer", w.node, nil).Detect(context.Background())
		if skip, ok := finding.IsSkip(err); !ok || !strings.Contains(skip, "cluster view 3m0s old, older than its 2m0s limit") {
			t.Fatalf("err %v, want a skip naming the view's age and limit", err)
		}
	})
	t.Run("over budget", func(t *testing.T) {
		w := ipvsCoreDNSRollout(t)
		w.view.SetFreshness(cluster.Freshness{Synced: true, Connected: true, OverBudget: "cluster view over its memory budget (--cluster-view-memory 1Mi): 3 Services/EndpointSlices are not held"})
		_, err := newIPVSDetector(t, "IPVSStaleRealServer", w.node, nil).Detect(context.Background())
		if skip, ok := finding.IsSkip(err); !ok || !strings.Contains(skip, "--cluster-view-memory 1Mi") {
			t.Fatalf("err %v, want a skip naming the budget", err)
		}
	})
}

// TestUsesClusterViewDeclared: every detector that reads the cluster view
// to compare the node with it says how old the view is.
func TestUsesClusterViewDeclared(t *testing.T) {
	w := ipvsCoreDNSRollout(t)
	for _, name := range []string{"IPVSMissingVirtualServer", "IPVSStaleRealServer", "IPVSStaleVirtualServer", "IPVSUDPDeadBackend",
		"DataplaneDrift", "KubeProxyNotHearingAPI", ConntrackStaleServiceEntriesName, ServicePathProbeName} {
		typ, ok := Lookup(name)
		if !ok {
			t.Fatalf("%s not registered", name)
		}
		d, err := typ.New(typ.NewParams(), w.node)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, ok := d.(*viewAged); !ok {
			t.Errorf("%s is not declared UsesClusterView", name)
		}
	}
}
