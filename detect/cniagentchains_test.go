package detect

import (
	"context"
	"github.com/remediate-dev/remediate/internal/finding"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/cnichains"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/procs"
)

// TestCNIAgentChainsWhoRuns: a process of the agent's name in another
// network namespace (a pod's) is not the node's agent: skipped with that
// said; an agent whose chains were never seen (nftables or eBPF mode) is
// ok with that said, and nothing is remembered for it.
func TestCNIAgentChainsWhoRuns(t *testing.T) {
	p := procs.NewFake(1)
	n, _ := newIssue3Node(p)
	fk := iptables.NewFake()
	b, err := os.ReadFile("testdata/cniagents/calico.save")
	if err != nil {
		t.Fatal(err)
	}
	fk.SetRules(iptables.IPv4, iptables.Legacy, string(b))
	n.IPTables = fk
	store := &cnichains.MemStore{}
	n.CNIChains = store
	d := newIssue3Detector(t, "CNIAgentChains", n, func(p any) {
		pp := p.(*CNIAgentChainsParams)
		pp.Families, pp.Backends = []string{"IPv4"}, []string{"legacy"}
	})
	inPod := fakeProc(77, 1, "flanneld", procT0.Add(-time.Hour), "S", "flanneld")
	inPod.NetNS = "net:[4026532999]"
	p.Add(inPod)
	_, err = d.Detect(context.Background())
	if why, ok := finding.IsSkip(err); !ok || !strings.Contains(why, "in other network namespaces only: flanneld pid 77") {
		t.Fatalf("agent in a pod's netns: %v", err)
	}

	p.Add(fakeProc(78, 1, "flanneld", procT0.Add(-time.Hour), "S", "flanneld"))
	got, err := d.Detect(context.Background())
	if err != nil || len(got) != 0 {
		t.Fatalf("flannel in nftables mode: %+v, %v", got, err)
	}
	if j := d.(Judged).Judged(); !strings.Contains(j, "no iptables chain of flannel seen yet") {
		t.Errorf("judged %q", j)
	}
	if m, _ := store.Load(); len(m.Agents) != 0 {
		t.Errorf("remembered %+v for an agent with no chain", m.Agents)
	}
}

// TestCNIAgentChainsSavesBounded: the memory is written when what it
// remembers changes, and otherwise at most once a minute (not every
// cycle).
func TestCNIAgentChainsSavesBounded(t *testing.T) {
	p := procs.NewFake(1)
	n, clk := newIssue3Node(p)
	fk := iptables.NewFake()
	b, err := os.ReadFile("testdata/cniagents/flannel.save")
	if err != nil {
		t.Fatal(err)
	}
	fk.SetRules(iptables.IPv4, iptables.Legacy, string(b))
	n.IPTables = fk
	store := &cnichains.MemStore{}
	n.CNIChains = store
	p.Add(fakeProc(78, 1, "flanneld", procT0.Add(-time.Hour), "S", "flanneld"))
	d := newIssue3Detector(t, "CNIAgentChains", n, func(p any) {
		pp := p.(*CNIAgentChainsParams)
		pp.Families, pp.Backends = []string{"IPv4"}, []string{"legacy"}
	})
	detect := func() {
		t.Helper()
		if got, err := d.Detect(context.Background()); err != nil || len(got) != 0 {
			t.Fatalf("%+v, %v", got, err)
		}
	}
	detect()
	for i := 0; i < 5; i++ {
		clk.Step(10 * time.Second)
		detect()
	}
	if store.Saves != 1 {
		t.Fatalf("%d saves in 50 s of unchanged rules, want 1", store.Saves)
	}
	clk.Step(10 * time.Second)
	detect()
	if store.Saves != 2 {
		t.Fatalf("%d saves after a minute, want 2", store.Saves)
	}
	// A hook gone: the finding, and the hook stays remembered.
	rs, _ := iptables.ParseString(string(b))
	rs.DeleteRules("filter", "FORWARD", func(r iptables.Rule) bool { return r.Target == "FLANNEL-FWD" })
	fk.SetRules(iptables.IPv4, iptables.Legacy, rs.String())
	clk.Step(time.Second)
	if got, err := d.Detect(context.Background()); err != nil || len(got) != 1 {
		t.Fatalf("hook removed: %+v, %v", got, err)
	}
	m, _ := store.Load()
	if _, ok := m.Get("flannel", "IPv4/legacy").Hooks["filter/FORWARD->FLANNEL-FWD"]; !ok {
		t.Errorf("the remembered hook was dropped: %+v", m)
	}
}
