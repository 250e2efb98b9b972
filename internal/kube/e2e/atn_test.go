package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// TestGuardrailsAtN: the cluster guardrails at N nodes, on the real
// kube-apiserver and etcd, each node a contender of its own: its own client
// impersonating the DaemonSet's ServiceAccount on its node (the enforce
// overlay's RBAC and admission policy judge every Lease write), its own
// guardrail objects (guardrails.Chain over the node's Budget and Storm, as
// the daemon's wiring builds them).
//
//   - budget: 50 contenders want a disruptive action at the same instant
//     and retry each (scaled) cycle until each had its turn: 3 such rounds
//     at the default budget of 1 slot (150 acquisitions), 2 at 3 slots.
//     An independent observer (the recorded [acquire, release] intervals on
//     the shared monotonic clock, and a watch of the slot Leases) finds
//     never more than the budget's slots held at once and no slot taken
//     from a live holder; every contender gets its turn in every round.
//     (The storm guard is in their chain and asked, as in the daemon; no
//     node-status Lease is published, so it allows.)
//   - dead-holder: a holder that dies (its renewals stop, it never
//     releases) frees its slot only when its Lease expires, never before.
//   - release-during-renewal: Release frees the slot although a renewal
//     wrote the Lease between Release's read and write.
//   - storm: N node-status Leases (N = 2, 10, 50, 200) written by the real
//     Publish, k of them firing rule R: every one of the k contenders gets
//     the same verdict, a block exactly when k/N > MaxShare with at least
//     MinNodes live; expired Leases are not counted.
func TestGuardrailsAtN(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: deploytest.Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deploytest.ApplyOverlay(t, cp, "enforce", false)
	t.Run("budget", func(t *testing.T) { testBudgetAtN(t, cp) })
	t.Run("dead-holder", func(t *testing.T) { testBudgetDeadHolder(t, cp) })
	t.Run("release-during-renewal", func(t *testing.T) { testReleaseDuringRenewal(t, cp) })
	t.Run("storm", func(t *testing.T) { testStormAtN(t, cp) })
}

// leaseCounter counts a contender's Lease requests by kind.
type leaseCounter struct {
	get, create, update, list, conflict, other atomic.Int64
	// written counts the creates and updates the apiserver accepted.
	written atomic.Int64
}

func (c *leaseCounter) add(o *leaseCounter) {
	for _, p := range [][2]*atomic.Int64{{&c.get, &o.get}, {&c.create, &o.create}, {&c.update, &o.update},
		{&c.list, &o.list}, {&c.conflict, &o.conflict}, {&c.other, &o.other}, {&c.written, &o.written}} {
		p[0].Add(p[1].Load())
	}
}

type countingRT struct {
	next http.RoundTripper
	c    *leaseCounter
}

func (rt countingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.next.RoundTrip(req)
	p := req.URL.Path
	switch {
	case !strings.Contains(p, "/leases"):
		rt.c.other.Add(1)
	case req.Method == http.MethodGet && strings.HasSuffix(p, "/leases"):
		rt.c.list.Add(1)
	case req.Method == http.MethodGet:
		rt.c.get.Add(1)
	case req.Method == http.MethodPost:
		rt.c.create.Add(1)
	case req.Method == http.MethodPut:
		rt.c.update.Add(1)
	default:
		rt.c.other.Add(1)
	}
	if err == nil && resp.StatusCode == http.StatusConflict {
		rt.c.conflict.Add(1)
	}
	if err == nil && resp.StatusCode/100 == 2 && (req.Method == http.MethodPost || req.Method == http.MethodPut) && strings.Contains(p, "/leases") {
		rt.c.written.Add(1)
	}
	return resp, err
}

// countedClient is the daemon's client on node (daemonClient) with its
// requests counted into c.
func countedClient(t *testing.T, cp *controlplane.ControlPlane, node string, c *leaseCounter) kubernetes.Interface {
	t.Helper()
	kc, err := kube.NewClient(deploytest.AsDaemon(cp, node), kube.Options{QPS: 50, Burst: 100,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return countingRT{rt, c} }})
	if err != nil {
		t.Fatal(err)
	}
	return kc.Interface
}

// noHistory is a Ledger with nothing recorded: the node guardrails allow.
type noHistory struct{}

func (noHistory) Escalated(string) (int, string, bool) { return 0, "", false }
func (noHistory) UnknownHistorySince() time.Time       { return time.Time{} }
func (noHistory) Attempts() []guardrails.Attempt       { return nil }

// contender is one node's daemon as far as the cluster guardrails go.
type contender struct {
	node   string
	budget *guardrails.Budget
	chain  []guardrails.Guardrail
	n      leaseCounter
}

func newContender(t *testing.T, cp *controlplane.ControlPlane, node string, bo guardrails.BudgetOptions) *contender {
	c := &contender{node: node}
	cs := countedClient(t, cp, node, &c.n)
	bo.Namespace, bo.Node = deploytest.Namespace, node
	c.budget = guardrails.NewBudget(cs, bo)
	storm := guardrails.NewStorm(cs, guardrails.StormOptions{Namespace: deploytest.Namespace, Node: node})
	acted := 0
	c.chain = guardrails.Chain(guardrails.Node{Ledger: noHistory{}, MaxActionsPerHour: 1 << 30, MaxTargetsPerCycle: 1 << 30, Acted: &acted},
		guardrails.Cluster{Storm: storm, Budget: c.budget}, "")
	return c
}

// admit runs the chain as the engine's admit does: in order, the first
// block decides, and what holders took is released on a block.
func (c *contender) admit(ctx context.Context, r *guardrails.Request) ([]guardrails.Holder, *guardrails.Blocked) {
	var held []guardrails.Holder
	for _, g := range c.chain {
		if err := g.Check(ctx, r); err != nil {
			for _, h := range held {
				h.Release(ctx, r)
			}
			return nil, guardrails.AsBlocked(g.Name(), err)
		}
		if h, ok := g.(guardrails.Holder); ok && !r.DryRun {
			held = append(held, h)
		}
	}
	return held, nil
}

var restartRule = &policy.Rule{Name: "kube-proxy-sync-stale", RateLimit: policy.RateLimit{Max: 3, Per: policy.D(time.Hour)}}

func restartReq(node string) *guardrails.Request {
	return &guardrails.Request{Rule: restartRule, ActionType: "RestartKubeProxy", Disruptive: true,
		Finding: finding.Finding{Detector: "KubeProxySyncStale", Target: "kube-system/kube-proxy-" + node}, Now: time.Now()}
}

// hold is one recorded [acquire, release] interval, on the test's
// monotonic clock, strictly inside the time the contender held the slot
// (after Check returned, before Release was called).
type hold struct {
	node       string
	round      int
	start, end time.Time
}

// maxOverlap is the largest number of intervals open at once (an interval
// ending exactly when another starts does not overlap it).
func maxOverlap(hs []hold) (int, string) {
	type ev struct {
		at    time.Time
		delta int
		node  string
	}
	evs := make([]ev, 0, 2*len(hs))
	for _, h := range hs {
		evs = append(evs, ev{h.start, 1, h.node}, ev{h.end, -1, h.node})
	}
	sort.Slice(evs, func(i, j int) bool {
		if !evs[i].at.Equal(evs[j].at) {
			return evs[i].at.Before(evs[j].at)
		}
		return evs[i].delta < evs[j].delta
	})
	open, most := map[string]bool{}, 0
	witness := ""
	for _, e := range evs {
		if e.delta > 0 {
			open[e.node] = true
		} else {
			delete(open, e.node)
		}
		if len(open) > most {
			most = len(open)
			var ns []string
			for n := range open {
				ns = append(ns, n)
			}
			sort.Strings(ns)
			witness = strings.Join(ns, ", ")
		}
	}
	return most, witness
}

// leaseObserver watches the slot Leases (as the admin) and checks every
// version against the previous one: a slot changes holder only after its
// holder released it or its Lease expired, and never more than slots are
// held at once.
type leaseObserver struct {
	slots     int
	mu        sync.Mutex
	last      map[string]*coordv1.Lease
	versions  int
	takeovers int // holder changed from one node to another after expiry
	maxHeld   int
	errs      []string
	done      chan struct{}
}

func watchSlots(t *testing.T, ctx context.Context, cs kubernetes.Interface, prefix string, slots int) *leaseObserver {
	t.Helper()
	o := &leaseObserver{slots: slots, last: map[string]*coordv1.Lease{}, done: make(chan struct{})}
	leases := cs.CoordinationV1().Leases(deploytest.Namespace)
	l, err := leases.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rv := l.ResourceVersion
	w, err := leases.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	fail := func(f string, a ...any) {
		o.mu.Lock()
		o.errs = append(o.errs, fmt.Sprintf(f, a...))
		o.mu.Unlock()
	}
	go func() {
		defer close(o.done)
		defer func() { w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case ev, ok := <-w.ResultChan():
				if ctx.Err() != nil {
					return
				}
				if !ok {
					// The client's timeout ends a watch: go on from the
					// last version seen, so no version is missed.
					if w, err = leases.Watch(ctx, metav1.ListOptions{ResourceVersion: rv}); err != nil {
						if ctx.Err() == nil {
							fail("lease watch from %s: %v", rv, err)
						}
						return
					}
					continue
				}
				if ev.Type == watch.Error {
					fail("lease watch: %v", ev.Object)
					return
				}
				l, isLease := ev.Object.(*coordv1.Lease)
				if !isLease {
					continue
				}
				rv = l.ResourceVersion
				if strings.HasPrefix(l.Name, prefix+"-") {
					o.see(ev.Type, l)
				}
			}
		}
	}()
	return o
}

// waitFor waits (at most limit) until the watch saw n versions.
func (o *leaseObserver) waitFor(n int, limit time.Duration) {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		o.mu.Lock()
		v := o.versions
		o.mu.Unlock()
		if v >= n {
			return
		}
	}
}

// expiry is when a held Lease expires: its last renewal plus its duration
// (written here again rather than with guardrails.SlotFree, so that the
// observer does not share a bug of the code it checks).
func expiry(l *coordv1.Lease) time.Time {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

func holderOf(l *coordv1.Lease) string {
	if l == nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func (o *leaseObserver) see(typ watch.EventType, l *coordv1.Lease) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.versions++
	prev := o.last[l.Name]
	if typ == watch.Deleted {
		delete(o.last, l.Name)
		return
	}
	o.last[l.Name] = l
	ph, nh := holderOf(prev), holderOf(l)
	if ph != "" && nh != "" && ph != nh {
		// Taken over without a release: only an expired Lease may be.
		at := time.Now()
		if l.Spec.AcquireTime != nil {
			at = l.Spec.AcquireTime.Time
		}
		if exp := expiry(prev); at.Before(exp) {
			o.errs = append(o.errs, fmt.Sprintf("%s taken by %s at %s from %s, whose Lease was live until %s",
				l.Name, nh, at.Format(time.RFC3339Nano), ph, exp.Format(time.RFC3339Nano)))
		} else {
			o.takeovers++
		}
	}
	held := 0
	for _, x := range o.last {
		if holderOf(x) != "" && time.Now().Before(expiry(x)) {
			held++
		}
	}
	if held > o.maxHeld {
		o.maxHeld = held
	}
	if held > o.slots {
		o.errs = append(o.errs, fmt.Sprintf("%d slot Leases held at once (budget %d) after %s by %s", held, o.slots, l.Name, nh))
	}
}

// testBudgetAtN: 50 contenders, each round all want the slot at the same
// instant and retry on their (scaled) cycle until they had their turn.
func testBudgetAtN(t *testing.T, cp *controlplane.ControlPlane) {
	const n = 50
	for _, tc := range []struct {
		slots, rounds int
	}{{1, 3}, {3, 2}} {
		t.Run(fmt.Sprintf("slots=%d", tc.slots), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			prefix := fmt.Sprintf("remediate-budget-atn%d", tc.slots)
			cs := make([]*contender, n)
			for i := range cs {
				cs[i] = newContender(t, cp, fmt.Sprintf("atn-%02d", i),
					guardrails.BudgetOptions{Slots: tc.slots, TTL: time.Minute, Prefix: prefix})
			}
			obs := watchSlots(t, ctx, cp.Client, prefix, tc.slots)
			var (
				mu       sync.Mutex
				holds    []hold
				blocked  atomic.Int64
				failures []string
			)
			fail := func(f string, a ...any) {
				mu.Lock()
				failures = append(failures, fmt.Sprintf(f, a...))
				mu.Unlock()
			}
			start := time.Now()
			var roundTimes []string
			for round := 0; round < tc.rounds; round++ {
				rs := time.Now()
				var wg sync.WaitGroup
				gate := make(chan struct{})
				deadline := time.Now().Add(30 * time.Second)
				for i, c := range cs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rng := rand.New(rand.NewSource(int64(round*n + i)))
						<-gate
						for {
							r := restartReq(c.node)
							held, b := c.admit(ctx, r)
							if b != nil {
								if b.Guardrail != guardrails.GuardBudget || strings.Contains(b.Reason, "failing closed") {
									fail("%s round %d: blocked by something else than a full budget: %v", c.node, round, b)
									return
								}
								blocked.Add(1)
								if time.Now().After(deadline) {
									fail("%s round %d: starved: no turn in 30 s", c.node, round)
									return
								}
								// The next cycle (the daemon's 10 s, scaled: 100-200 ms).
								time.Sleep(time.Duration(100+rng.Intn(100)) * time.Millisecond)
								continue
							}
							if len(held) != 1 {
								fail("%s: %d holders took something, want the budget alone", c.node, len(held))
							}
							h := hold{node: c.node, round: round, start: time.Now()}
							// Act and verify (scaled: a kube-proxy restart and its
							// verification, 10-30 s, scaled: 20-40 ms), then the
							// engine releases what it held (releaseAll).
							time.Sleep(time.Duration(20+rng.Intn(20)) * time.Millisecond)
							h.end = time.Now()
							rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
							for _, x := range held {
								x.Release(rctx, r)
							}
							rcancel()
							mu.Lock()
							holds = append(holds, h)
							mu.Unlock()
							return
						}
					}()
				}
				close(gate)
				wg.Wait()
				roundTimes = append(roundTimes, time.Since(rs).Round(time.Millisecond).String())
			}
			elapsed := time.Since(start)
			var total leaseCounter
			for _, c := range cs {
				total.add(&c.n)
			}
			obs.waitFor(int(total.written.Load()), 10*time.Second)
			cancel()
			<-obs.done
			for _, f := range failures {
				t.Error(f)
			}
			if obs.versions != int(total.written.Load()) {
				t.Errorf("the watch saw %d versions of the slot Leases, the contenders wrote %d", obs.versions, total.written.Load())
			}
			most, witness := maxOverlap(holds)
			acq := int64(len(holds))
			t.Logf("slots=%d: rounds took %s", tc.slots, strings.Join(roundTimes, ", "))
			t.Logf("slots=%d: %d contenders, %d rounds in %v: %d acquisitions, %d blocked checks, at most %d held at once (intervals), %d (Lease watch, %d versions)",
				tc.slots, n, tc.rounds, elapsed.Round(time.Millisecond), acq, blocked.Load(), most, obs.maxHeld, obs.versions)
			t.Logf("slots=%d: Lease requests: %d GET, %d POST, %d PUT (%d of them 409 Conflict), %d LIST (storm guard); per acquisition %.1f budget requests (GET+POST+PUT), %.1f with the storm LIST; other requests %d",
				tc.slots, total.get.Load(), total.create.Load(), total.update.Load(), total.conflict.Load(), total.list.Load(),
				float64(total.get.Load()+total.create.Load()+total.update.Load())/float64(max(acq, 1)),
				float64(total.get.Load()+total.create.Load()+total.update.Load()+total.list.Load())/float64(max(acq, 1)), total.other.Load())
			for _, e := range obs.errs {
				t.Error(e)
			}
			if most > tc.slots {
				t.Errorf("%d disruptive actions at once with a budget of %d (%s)", most, tc.slots, witness)
			}
			// Every contender had its turn in every round.
			turns := map[string]int{}
			for _, h := range holds {
				turns[h.node]++
			}
			for _, c := range cs {
				if turns[c.node] != tc.rounds {
					t.Errorf("%s had %d turns in %d rounds", c.node, turns[c.node], tc.rounds)
				}
			}
			// The storm guard's list is kept for DefaultStormListTTL and
			// shared by a contender's checks: at most one LIST per
			// contender per TTL (each contender checks every 100-200 ms
			// while it waits; every check used to LIST).
			if limit := int64(n) * (int64(elapsed/guardrails.DefaultStormListTTL) + 1); total.list.Load() > limit {
				t.Errorf("%d storm-guard LISTs for %d checks in %v: more than one per contender per %v (%d)",
					total.list.Load(), acq+blocked.Load(), elapsed.Round(time.Millisecond), guardrails.DefaultStormListTTL, limit)
			}
			if blocked.Load() == 0 || most < tc.slots {
				t.Errorf("no contention: %d blocked checks, at most %d held at once", blocked.Load(), most)
			}
		})
	}
}

// testBudgetDeadHolder: a holder dies while holding the only slot (its
// renewals stop, it never releases); 49 others keep asking. Nobody gets the
// slot before the dead holder's Lease expires (last renewal + TTL); one
// does soon after.
func testBudgetDeadHolder(t *testing.T, cp *controlplane.ControlPlane) {
	const (
		n      = 50
		ttl    = 3 * time.Second
		prefix = "remediate-budget-dead"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cs := make([]*contender, n)
	for i := range cs {
		cs[i] = newContender(t, cp, fmt.Sprintf("dead-%02d", i), guardrails.BudgetOptions{Slots: 1, TTL: ttl, Prefix: prefix})
	}
	obs := watchSlots(t, ctx, cp.Client, prefix, 1)
	dying := cs[0]
	if _, b := dying.admit(ctx, restartReq(dying.node)); b != nil {
		t.Fatalf("first holder blocked: %v", b)
	}
	dctx, die := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); dying.budget.Run(dctx) }()

	type win struct {
		node string
		at   time.Time // wall clock, as the Lease's times
	}
	won := make(chan win, n)
	var blocked atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i, c := range cs[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(i)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				held, b := c.admit(ctx, restartReq(c.node))
				if b == nil {
					won <- win{c.node, time.Now()}
					_ = held // keeps it until the Lease expires: the test ends first
					return
				}
				if b.Guardrail != guardrails.GuardBudget || strings.Contains(b.Reason, "failing closed") {
					t.Errorf("%s: %v", c.node, b)
					return
				}
				blocked.Add(1)
				time.Sleep(time.Duration(100+rng.Intn(100)) * time.Millisecond)
			}
		}()
	}
	// Let it renew at least once (every TTL/3), then kill it: no release.
	time.Sleep(ttl/3 + ttl/2)
	die()
	<-runDone
	l, err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).Get(ctx, prefix+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if holderOf(l) != dying.node || !l.Spec.RenewTime.After(l.Spec.AcquireTime.Time) {
		t.Fatalf("the dying holder's Lease: holder %q, acquired %v, renewed %v: want it held and renewed", holderOf(l), l.Spec.AcquireTime, l.Spec.RenewTime)
	}
	expires := expiry(l)
	var w win
	select {
	case w = <-won:
	case <-time.After(ttl + 10*time.Second):
		t.Fatalf("nobody took the dead holder's slot within its TTL + 10 s (Lease expired at %s)", expires.Format(time.RFC3339Nano))
	}
	close(stop)
	wg.Wait()
	cancel()
	<-obs.done
	for _, e := range obs.errs {
		t.Error(e)
	}
	// Lease times are whole microseconds.
	if w.at.Before(expires.Add(-time.Microsecond)) {
		t.Errorf("%s took the slot at %s, before the dead holder's Lease expired at %s", w.node, w.at.Format(time.RFC3339Nano), expires.Format(time.RFC3339Nano))
	}
	if obs.takeovers != 1 {
		t.Errorf("%d takeovers of an expired slot seen by the watch, want 1", obs.takeovers)
	}
	var total leaseCounter
	for _, c := range cs {
		total.add(&c.n)
	}
	t.Logf("dead holder: Lease expired at %s, %s took it %v later; %d blocked checks meanwhile (%d GET, %d PUT, %d 409)",
		expires.Format("15:04:05.000"), w.node, w.at.Sub(expires).Round(time.Millisecond), blocked.Load(),
		total.get.Load(), total.update.Load(), total.conflict.Load())
}

// testStormAtN: the storm guard's verdict over N real node-status Leases.
func testStormAtN(t *testing.T, cp *controlplane.ControlPlane) {
	const (
		maxShare = 0.3
		minNodes = 3
		rule     = "kube-proxy-sync-stale"
	)
	ctx := context.Background()
	type tcase struct {
		n, k, dead int
	}
	var cases []tcase
	for _, n := range []int{10, 50, 200} {
		thr := n * 3 / 10 // largest k not above the share
		cases = append(cases, tcase{n, thr, 0}, tcase{n, thr + 1, 0}, tcase{n, thr - 1, 0},
			// Dead nodes firing the rule: counted, they would make it a storm.
			tcase{n, thr, n})
	}
	// Under MinNodes live: never a storm, dead Leases do not make up the
	// number.
	cases = append(cases, tcase{2, 2, 0}, tcase{2, 2, 5})
	clients := map[string]kubernetes.Interface{}
	client := func(node string) kubernetes.Interface {
		if c, ok := clients[node]; ok {
			return c
		}
		c := countedClient(t, cp, node, &leaseCounter{})
		clients[node] = c
		return c
	}
	sel := metav1.ListOptions{LabelSelector: guardrails.LabelLease + "=" + guardrails.LeaseNodeStatus}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("N=%d/k=%d/dead=%d", tc.n, tc.k, tc.dead), func(t *testing.T) {
			if err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			old := clocktesting.NewFakePassiveClock(now.Add(-10 * time.Minute))
			storms := make([]*guardrails.Storm, tc.n)
			var wg sync.WaitGroup
			errs := make(chan error, tc.n+tc.dead)
			publish := func(s *guardrails.Storm, firing []string) {
				defer wg.Done()
				if err := s.Publish(ctx, firing); err != nil {
					errs <- err
				}
			}
			for i := range tc.n {
				node := fmt.Sprintf("storm-%03d", i)
				storms[i] = guardrails.NewStorm(client(node), guardrails.StormOptions{Namespace: deploytest.Namespace, Node: node,
					MaxShare: maxShare, MinNodes: minNodes, TTL: 5 * time.Minute})
				firing := []string{"other-rule"}
				if i < tc.k {
					firing = append(firing, rule)
				}
				wg.Add(1)
				go publish(storms[i], firing)
			}
			for i := range tc.dead {
				node := fmt.Sprintf("storm-dead-%03d", i)
				s := guardrails.NewStorm(client(node), guardrails.StormOptions{Namespace: deploytest.Namespace, Node: node,
					MaxShare: maxShare, MinNodes: minNodes, TTL: 5 * time.Minute, Clock: old})
				wg.Add(1)
				go publish(s, []string{rule})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			l, err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).List(ctx, sel)
			if err != nil {
				t.Fatal(err)
			}
			if len(l.Items) != tc.n+tc.dead {
				t.Fatalf("%d node-status Leases, want %d", len(l.Items), tc.n+tc.dead)
			}
			if tc.dead == 0 {
				t.Logf("each Check LISTs %d node-status Leases: %d bytes of protobuf", len(l.Items), l.Size())
			}
			// Expected, in integers: more than 3/10 of the live nodes, at
			// least minNodes live, at least two affected.
			want := tc.n >= minNodes && tc.k >= 2 && tc.k*10 > 3*tc.n
			verdicts := make([]error, tc.k)
			for i := range tc.k {
				wg.Add(1)
				go func() {
					defer wg.Done()
					verdicts[i] = storms[i].Check(ctx, restartReq(fmt.Sprintf("storm-%03d", i)))
				}()
			}
			wg.Wait()
			got := map[string]int{}
			for i, err := range verdicts {
				var b *guardrails.Blocked
				switch {
				case err == nil:
					got["allow"]++
				case errors.As(err, &b) && b.Guardrail == guardrails.GuardStorm:
					got["block"]++
					if i == 0 {
						t.Logf("%s", b.Reason)
					}
				default:
					t.Errorf("storm-%03d: %v", i, err)
				}
			}
			verdict := "allow"
			if want {
				verdict = "block"
			}
			if got[verdict] != tc.k {
				t.Errorf("%d of %d live nodes firing (%d dead firing): want every one of the %d to %s, got %v", tc.k, tc.n, tc.dead, tc.k, verdict, got)
			}
		})
	}
}

// hookRT calls before and after around each request.
type hookRT struct {
	next          http.RoundTripper
	before, after func(*http.Request)
}

func (rt hookRT) RoundTrip(req *http.Request) (*http.Response, error) {
	rt.before(req)
	resp, err := rt.next.RoundTrip(req)
	rt.after(req)
	return resp, err
}

// testReleaseDuringRenewal: the budget's renewal (Run, every TTL/3) and the
// engine's Release of the same slot interleave: the renewal reads the
// Lease, Release reads it, the renewal writes, Release writes. Release must
// still free the slot; it used to fail on the conflict and leave the slot
// held (no longer renewed, but blocking every node's disruptive actions)
// until it expired, 10 minutes by default.
func testReleaseDuringRenewal(t *testing.T, cp *controlplane.ControlPlane) {
	const (
		node   = "renewal-0"
		prefix = "remediate-budget-renewal"
	)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		armed                  atomic.Bool
		gets, puts             atomic.Int32
		renewPutWaiting        = make(chan struct{})
		letRenewPut, renewDone = make(chan struct{}), make(chan struct{})
		renewPutSeq            atomic.Int32
	)
	wait := func(c <-chan struct{}, what string) {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Errorf("timed out waiting for %s", what)
		}
	}
	slot := func(req *http.Request) bool { return armed.Load() && strings.HasSuffix(req.URL.Path, "/"+prefix+"-0") }
	kc, err := kube.NewClient(deploytest.AsDaemon(cp, node), kube.Options{QPS: 50, Burst: 100,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return hookRT{rt, func(req *http.Request) {
				// The renewal's write (the first PUT) waits until Release read the Lease.
				if slot(req) && req.Method == http.MethodPut {
					if n := puts.Add(1); n == 1 {
						renewPutSeq.Store(n)
						close(renewPutWaiting)
						wait(letRenewPut, "Release's read")
					}
				}
			}, func(req *http.Request) {
				if !slot(req) {
					return
				}
				switch {
				case req.Method == http.MethodPut && renewPutSeq.CompareAndSwap(1, 0):
					close(renewDone)
				case req.Method == http.MethodGet && gets.Add(1) == 2:
					// Release's read (the renewal's was the first): now
					// the renewal writes, then Release does.
					close(letRenewPut)
					wait(renewDone, "the renewal's write")
				}
			}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	b := guardrails.NewBudget(kc.Interface, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Node: node, Slots: 1, TTL: time.Minute, Prefix: prefix})
	r := restartReq(node)
	if err := b.Check(ctx, r); err != nil {
		t.Fatal(err)
	}
	before, err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).Get(ctx, prefix+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	renewed := make(chan struct{})
	go func() { defer close(renewed); b.Renew(ctx) }()
	wait(renewPutWaiting, "the renewal's write")
	b.Release(ctx, r)
	wait(renewed, "Renew")
	armed.Store(false)
	l, err := cp.Client.CoordinationV1().Leases(deploytest.Namespace).Get(ctx, prefix+"-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if gets.Load() < 2 || puts.Load() < 2 || l.ResourceVersion == before.ResourceVersion {
		t.Fatalf("the interleaving did not happen: %d reads, %d writes of the slot", gets.Load(), puts.Load())
	}
	if h := holderOf(l); h != "" {
		t.Fatalf("after Release the slot is still held by %q (renewed at %v): every node's disruptive actions wait until it expires at %s",
			h, l.Spec.RenewTime, expiry(l).Format(time.RFC3339))
	}
	other := guardrails.NewBudget(daemonClient(t, cp, "renewal-1").Interface, guardrails.BudgetOptions{Namespace: deploytest.Namespace, Node: "renewal-1", Slots: 1, TTL: time.Minute, Prefix: prefix})
	if err := other.Check(ctx, restartReq("renewal-1")); err != nil {
		t.Fatalf("another node cannot take the released slot: %v", err)
	}
}
