package guardrails

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// StormOptions configure the storm guard.
type StormOptions struct {
	// Namespace holds the node-status Leases.
	Namespace string
	// Node is this node's name.
	Node string
	// MaxShare: when more than this share of the live nodes report the
	// same rule firing at once, hold back (default 0.3).
	MaxShare float64
	// MinNodes: the guard only judges when at least this many nodes are
	// reporting (default 3), so two nodes of which one is sick is not a
	// "50% storm".
	MinNodes int
	// TTL: a node-status Lease not renewed for this long is a dead node and
	// not counted (default 5m). Publish renews every TTL/3 at most.
	//
	// Why not the Node condition's 5-minute heartbeat (TTL 15m, renewed
	// every 5m, a third of the writes): the guard divides the nodes firing
	// by the live ones, and a node that stopped renewing (down, or cut off
	// by the very partition a storm is) counts as live and not firing until
	// its TTL runs out. A longer TTL dilutes the share for longer, so the
	// guard would let more disruptive actions through in a storm, the
	// unsafe side. A change of the firing rules is written at once either
	// way; the renewal alone costs one UPDATE per TTL/3 (0.6 a minute).
	TTL time.Duration
	// AllActions applies the guard to every action; by default only
	// disruptive ones are held back.
	AllActions bool
	// ListTTL: the node-status Leases listed for one Check serve the
	// checks of the next ListTTL too (default DefaultStormListTTL; < 0:
	// every Check lists). At 5,000 nodes the list is ~2.9 MB: the checks of
	// one cycle (one per disruptive target) and a burst of retries cost one
	// LIST. The view is at most ListTTL older than a fresh one; the daemons
	// publish a change of their firing rules once a cycle (30 s by default).
	ListTTL time.Duration
	Clock   clock.PassiveClock
}

// DefaultStormListTTL is StormOptions.ListTTL's default.
const DefaultStormListTTL = 5 * time.Second

// Storm is the storm guard. Each daemon publishes the rules firing on its
// node in its own node-status Lease (Publish, called every cycle by the
// Reporter); Check counts, over the live Leases, how many nodes report the
// request's rule.
type Storm struct {
	cs   kubernetes.Interface
	opts StormOptions

	mu            sync.Mutex
	lastFiring    []string
	lastPublished time.Time
	// lease is the Lease as last written (its resourceVersion): a renewal
	// updates it without reading it first.
	lease *coordv1.Lease

	// obs judges the other nodes' Leases by when this node saw them
	// renewed (besides their own times: see CountFiring).
	obs *Observed
	// listMu serialises the LIST; kept (listed at keptAt; zero: none, an
	// empty list is kept too) serves the checks of the next ListTTL.
	listMu sync.Mutex
	kept   []coordv1.Lease
	keptAt time.Time
}

var _ Guardrail = (*Storm)(nil)

// NewStorm returns the storm guard. cs nil means no cluster access: the
// guard then allows (it cannot count), and disruptive actions are blocked
// by the budget and freshness guards anyway.
func NewStorm(cs kubernetes.Interface, opts StormOptions) *Storm {
	if opts.MaxShare <= 0 {
		opts.MaxShare = 0.3
	}
	if opts.MinNodes <= 0 {
		opts.MinNodes = 3
	}
	if opts.TTL <= 0 {
		opts.TTL = 5 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.ListTTL == 0 {
		opts.ListTTL = DefaultStormListTTL
	}
	return &Storm{cs: cs, opts: opts, obs: NewObserved(opts.Clock)}
}

// Name implements Guardrail.
func (s *Storm) Name() string { return GuardStorm }

// StatusLeaseName is the node-status Lease name of a node (hashed when the
// node name is too long for a Lease name).
func StatusLeaseName(node string) string {
	n := "remediate-node-" + node
	if len(n) <= 253 {
		return n
	}
	h := sha256.Sum256([]byte(node))
	return "remediate-node-" + node[:200] + "-" + hex.EncodeToString(h[:8])
}

// Publish writes the rules firing on this node (sorted, deduplicated) to
// its node-status Lease when they changed or the Lease is due for renewal.
// It updates the Lease it last wrote without reading it again (one UPDATE
// per renewal); the first time, or when that update finds the Lease
// changed (a conflict) or gone, it reads or creates it and writes once
// more.
func (s *Storm) Publish(ctx context.Context, firing []string) error {
	if s.cs == nil {
		return nil
	}
	firing = slices.Clone(firing)
	sort.Strings(firing)
	firing = slices.Compact(firing)
	now := s.opts.Clock.Now()
	s.mu.Lock()
	due := !slices.Equal(firing, s.lastFiring) || s.lastPublished.IsZero() || now.Sub(s.lastPublished) >= s.opts.TTL/3
	kept := s.lease
	s.mu.Unlock()
	if !due {
		return nil
	}
	js, _ := json.Marshal(firing)
	name := StatusLeaseName(s.opts.Node)
	leases := s.cs.CoordinationV1().Leases(s.opts.Namespace)
	mt := metav1.NewMicroTime(now)
	set := func(l *coordv1.Lease) *coordv1.Lease {
		l = l.DeepCopy()
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationFiring] = string(js)
		l.Spec.HolderIdentity = ptr.To(s.opts.Node)
		l.Spec.LeaseDurationSeconds = ptr.To(int32(s.opts.TTL.Seconds()))
		l.Spec.RenewTime = &mt
		return l
	}
	var (
		written *coordv1.Lease
		err     error
	)
	if kept != nil {
		written, err = leases.Update(ctx, set(kept), metav1.UpdateOptions{})
	}
	if kept == nil || apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		var l *coordv1.Lease
		l, err = leases.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			l = &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.opts.Namespace,
				Labels: map[string]string{LabelLease: LeaseNodeStatus, "app.kubernetes.io/name": "remediate"}},
				Spec: coordv1.LeaseSpec{AcquireTime: &mt}}
			written, err = leases.Create(ctx, set(l), metav1.CreateOptions{})
		case err == nil:
			written, err = leases.Update(ctx, set(l), metav1.UpdateOptions{})
		}
	}
	if err != nil {
		s.mu.Lock()
		s.lease = nil // read it again next time
		s.mu.Unlock()
		return fmt.Errorf("publishing node status lease %s/%s: %w", s.opts.Namespace, name, err)
	}
	s.mu.Lock()
	s.lastFiring, s.lastPublished, s.lease = firing, now, written
	s.mu.Unlock()
	return nil
}

// Check implements Guardrail.
func (s *Storm) Check(ctx context.Context, r *Request) error {
	if !r.Disruptive && !s.opts.AllActions {
		return nil
	}
	if s.cs == nil {
		return nil
	}
	items, err := s.statusLeases(ctx)
	if err != nil {
		return err
	}
	live, affected := CountFiring(items, r.Rule.Name, s.opts.Node, s.opts.Clock.Now(), s.obs)
	if why := StormVerdict(live, affected, s.opts.MaxShare, s.opts.MinNodes); why != "" {
		return Block(s.Name(), "rule %q: %s; suspecting a cluster-wide cause (control plane, network), holding back", r.Rule.Name, why)
	}
	return nil
}

// statusLeases returns the node-status Leases, listed at most every
// ListTTL.
func (s *Storm) statusLeases(ctx context.Context) ([]coordv1.Lease, error) {
	s.listMu.Lock()
	defer s.listMu.Unlock()
	now := s.opts.Clock.Now()
	if !s.keptAt.IsZero() && s.opts.ListTTL > 0 && now.Sub(s.keptAt) < s.opts.ListTTL {
		return s.kept, nil
	}
	list, err := s.cs.CoordinationV1().Leases(s.opts.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{LabelLease: LeaseNodeStatus}.String()})
	if err != nil {
		s.kept, s.keptAt = nil, time.Time{}
		return nil, fmt.Errorf("listing node status leases: %w", err)
	}
	s.obs.retain(list.Items)
	s.kept, s.keptAt = list.Items, now
	return list.Items, nil
}

// CountFiring counts the live node-status Leases and, among them, those
// listing rule. A Lease counts once per node: its holder's, under its
// holder's name (StatusLeaseName), as the admission policy lets only that
// node write it. It is live while renewed within its duration by its own
// times at now and, when obs is not nil, by what this node observed
// (Observed): a writer whose clock runs ahead, or a renewTime in the
// future, keeps a Lease live for one duration after it was seen, no
// longer. self always counts as live and affected (it is asking because
// the rule fires here).
func CountFiring(items []coordv1.Lease, rule, self string, now time.Time, obs *Observed) (live, affected int) {
	selfSeen := false
	counted := map[string]bool{}
	for i := range items {
		l := &items[i]
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		if holder == "" || l.Name != StatusLeaseName(holder) || counted[holder] {
			continue // not the holder's own Lease
		}
		counted[holder] = true
		if holder == self {
			selfSeen = true
			live++
			affected++
			continue
		}
		// Expired (a dead or removed node) by either judgment; obs is
		// asked every time, so that it records each renewal it sees.
		observedFree := obs != nil && obs.Free(l)
		if SlotFree(l, now) || observedFree {
			continue
		}
		live++
		var firing []string
		if json.Unmarshal([]byte(l.Annotations[AnnotationFiring]), &firing) == nil && slices.Contains(firing, rule) {
			affected++
		}
	}
	if !selfSeen {
		live++
		affected++
	}
	return live, affected
}

// StormVerdict returns why affected of live nodes is a storm, or "": more
// than maxShare of at least minNodes live nodes, and at least two.
func StormVerdict(live, affected int, maxShare float64, minNodes int) string {
	// One node alone is never a storm, whatever the cluster size.
	if live < minNodes || live == 0 || affected < 2 {
		return ""
	}
	share := float64(affected) / float64(live)
	if share > maxShare {
		limit := percent(maxShare, 1)
		got := percent(share, 1)
		// Never rounded onto the threshold it is above (61 of 200: 30.5%).
		for d := 2; got == limit && d <= 6; d++ {
			got = percent(share, d)
		}
		return fmt.Sprintf("%d of %d nodes (%s%%) report it at once, above the %s%% storm threshold",
			affected, live, got, limit)
	}
	return ""
}

// percent prints share as a percentage with at most decimals decimals,
// trailing zeros dropped (40, 66.7, 30.01).
func percent(share float64, decimals int) string {
	s := strconv.FormatFloat(share*100, 'f', decimals, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}
