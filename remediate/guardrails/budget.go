package guardrails

import (
	"context"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
)

// BudgetOptions configure the cluster-wide budget.
type BudgetOptions struct {
	// Namespace holds the slot Leases (the daemon's namespace).
	Namespace string
	// Slots is N: at most N disruptive actions at once cluster-wide.
	Slots int
	// TTL is the Lease duration. A holder renews its slots every TTL/3
	// while it holds them (Run); a crashed holder's slot is free TTL after
	// its last renewal.
	TTL time.Duration
	// MaxHold stops renewing a slot held longer than this (an engine that
	// never releases must not pin the budget); default 30m.
	MaxHold time.Duration
	// Node is this daemon's node name (the Lease holder identity).
	Node string
	// Prefix of the slot Lease names (default "remediate-budget"): slots
	// are Prefix-0 .. Prefix-(N-1). deploy/'s admission policy lets the
	// ServiceAccount write only Leases named remediate-budget-* (and its
	// node's status Lease): another prefix must start with
	// "remediate-budget-".
	Prefix string
	Clock  clock.WithTicker
	Log    *zap.Logger
}

// Budget is the cluster-wide Lease-based semaphore for disruptive actions.
// Check takes a free slot for a non-dry-run disruptive request (dry runs
// only say whether one is free); Release frees it after verification.
type Budget struct {
	cs   kubernetes.Interface
	opts BudgetOptions

	// obs judges the slot Leases by when this daemon saw them renewed.
	obs *Observed

	mu   sync.Mutex
	held map[string]heldSlot // by Request.Key()
}

type heldSlot struct {
	name  string
	since time.Time
}

var (
	_ Guardrail = (*Budget)(nil)
	_ Holder    = (*Budget)(nil)
)

// NewBudget returns the budget guardrail. cs nil means no cluster access:
// every disruptive request is blocked.
func NewBudget(cs kubernetes.Interface, opts BudgetOptions) *Budget {
	if opts.Slots <= 0 {
		opts.Slots = 1
	}
	if opts.TTL <= 0 {
		opts.TTL = 10 * time.Minute
	}
	if opts.MaxHold <= 0 {
		opts.MaxHold = 30 * time.Minute
	}
	if opts.Prefix == "" {
		opts.Prefix = "remediate-budget"
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log == nil {
		opts.Log = zap.NewNop()
	}
	return &Budget{cs: cs, opts: opts, held: map[string]heldSlot{}, obs: NewObserved(opts.Clock)}
}

// Name implements Guardrail.
func (b *Budget) Name() string { return GuardBudget }

// SlotName returns the Lease name of slot i.
func (b *Budget) SlotName(i int) string { return fmt.Sprintf("%s-%d", b.opts.Prefix, i) }

// SlotFree reports whether a Lease is free at now by its own times: no
// holder, or its last renewal older than its duration. Only for a reader
// that sees the Lease once (the fleet view): it trusts the writer's clock
// and the local one. The guardrails judge by what they observed
// (Observed): a clock that runs ahead, or a renewTime in the future, does
// not move their judgment.
func SlotFree(l *coordv1.Lease, now time.Time) bool {
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return true
	}
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return true
	}
	exp := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
	return !now.Before(exp)
}

// Check implements Guardrail.
func (b *Budget) Check(ctx context.Context, r *Request) error {
	if !r.Disruptive {
		return nil
	}
	if b.cs == nil {
		return Block(b.Name(), "no cluster access: cannot take a cluster-wide budget slot")
	}
	key := r.Key()
	now := b.opts.Clock.Now()
	b.mu.Lock()
	h, already := b.held[key]
	b.mu.Unlock()
	if already {
		// Only if the Lease is still ours: a slot no longer renewed
		// (maxHold, renewal errors) expires and may be someone else's.
		l, err := b.cs.CoordinationV1().Leases(b.opts.Namespace).Get(ctx, h.name, metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("reading budget lease %s/%s: %w", b.opts.Namespace, h.name, err)
		}
		if err == nil && l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == b.opts.Node && !b.obs.Free(l) {
			return nil
		}
		b.mu.Lock()
		delete(b.held, key)
		b.mu.Unlock()
	}
	holders := make([]string, 0, b.opts.Slots)
	start := b.startIndex()
	for k := 0; k < b.opts.Slots; k++ {
		i := (start + k) % b.opts.Slots
		name := b.SlotName(i)
		l, err := b.cs.CoordinationV1().Leases(b.opts.Namespace).Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			if r.DryRun {
				return nil
			}
			before := b.opts.Clock.Now()
			written, err := b.cs.CoordinationV1().Leases(b.opts.Namespace).Create(ctx, b.lease(name, r, now, nil), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				holders = append(holders, name+": taken concurrently")
				continue
			}
			if err != nil {
				return fmt.Errorf("creating budget lease %s/%s: %w", b.opts.Namespace, name, err)
			}
			b.obs.Wrote(written, before)
			b.remember(key, name, now)
			return nil
		case err != nil:
			return fmt.Errorf("reading budget lease %s/%s: %w", b.opts.Namespace, name, err)
		}
		if !b.obs.Free(l) {
			holders = append(holders, fmt.Sprintf("%s: %s (%s on %s)", name, *l.Spec.HolderIdentity,
				l.Annotations[AnnotationRule], l.Annotations[AnnotationTarget]))
			continue
		}
		if r.DryRun {
			return nil
		}
		before := b.opts.Clock.Now()
		written, err := b.cs.CoordinationV1().Leases(b.opts.Namespace).Update(ctx, b.lease(name, r, now, l), metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			holders = append(holders, name+": taken concurrently")
			continue
		}
		if err != nil {
			return fmt.Errorf("taking budget lease %s/%s: %w", b.opts.Namespace, name, err)
		}
		b.obs.Wrote(written, before)
		b.remember(key, name, now)
		return nil
	}
	sort.Strings(holders)
	verb := "all"
	if r.DryRun {
		verb = "would block: all"
	}
	return Block(b.Name(), "%s %d cluster-wide disruptive-action slots are held: %s",
		verb, b.opts.Slots, strings.Join(holders, "; "))
}

// startIndex spreads nodes over the slots so they do not all race for
// slot 0.
func (b *Budget) startIndex() int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(b.opts.Node))
	return int(h.Sum32() % uint32(b.opts.Slots))
}

func (b *Budget) remember(key, name string, now time.Time) {
	b.mu.Lock()
	b.held[key] = heldSlot{name: name, since: now}
	b.mu.Unlock()
	b.opts.Log.Info("took cluster budget slot", zap.String("lease", name), zap.String("key", key))
}

// lease builds the Lease for taking slot name (updating prev if non-nil).
func (b *Budget) lease(name string, r *Request, now time.Time, prev *coordv1.Lease) *coordv1.Lease {
	l := &coordv1.Lease{}
	transitions := int32(0)
	if prev != nil {
		l = prev.DeepCopy()
		if l.Spec.LeaseTransitions != nil {
			transitions = *l.Spec.LeaseTransitions + 1
		}
	}
	l.Name, l.Namespace = name, b.opts.Namespace
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelLease] = LeaseBudget
	l.Labels["app.kubernetes.io/name"] = "remediate"
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationRule] = r.Rule.Name
	l.Annotations[AnnotationTarget] = r.Finding.Target
	l.Annotations[AnnotationAction] = r.ActionType
	mt := metav1.NewMicroTime(now)
	l.Spec.HolderIdentity = ptr.To(b.opts.Node)
	l.Spec.LeaseDurationSeconds = ptr.To(int32(b.opts.TTL.Seconds()))
	l.Spec.AcquireTime = &mt
	l.Spec.RenewTime = &mt
	l.Spec.LeaseTransitions = &transitions
	return l
}

// Release implements Holder: it frees the slot taken for r if
// this daemon still holds it. Errors are logged; the slot then expires
// after TTL.
func (b *Budget) Release(ctx context.Context, r *Request) {
	key := r.Key()
	b.mu.Lock()
	h, ok := b.held[key]
	delete(b.held, key)
	b.mu.Unlock()
	if !ok || b.cs == nil {
		return
	}
	if err := b.free(ctx, h.name); err != nil {
		b.opts.Log.Warn("releasing cluster budget slot failed; it expires after its TTL",
			zap.String("lease", h.name), zap.Error(err))
		return
	}
	b.opts.Log.Info("released cluster budget slot", zap.String("lease", h.name), zap.String("key", key))
}

// free clears the slot's holder if it is still this node. The Lease's
// renewal (Run) may write it between the read and the write here: a
// conflict reads it again (a few times, retry.DefaultRetry) rather than
// leaving the slot held, unrenewed, until it expires.
func (b *Budget) free(ctx context.Context, name string) error {
	leases := b.cs.CoordinationV1().Leases(b.opts.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != b.opts.Node {
			return nil // expired and taken by someone else: nothing to free
		}
		l.Spec.HolderIdentity = nil
		l.Spec.RenewTime = nil
		l.Spec.AcquireTime = nil
		delete(l.Annotations, AnnotationRule)
		delete(l.Annotations, AnnotationTarget)
		delete(l.Annotations, AnnotationAction)
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
}

// Held returns the Lease names this daemon holds, sorted.
func (b *Budget) Held() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]string, 0, len(b.held))
	for _, h := range b.held {
		out = append(out, h.name)
	}
	sort.Strings(out)
	return out
}

// Renew extends every held slot's Lease (RenewTime = now). A slot held
// longer than MaxHold is no longer renewed and expires; a slot that is no
// longer ours (expired and retaken) is forgotten.
func (b *Budget) Renew(ctx context.Context) {
	if b.cs == nil {
		return
	}
	now := b.opts.Clock.Now()
	b.mu.Lock()
	keys := make(map[string]heldSlot, len(b.held))
	for k, h := range b.held {
		keys[k] = h
	}
	b.mu.Unlock()
	for key, h := range keys {
		if now.Sub(h.since) > b.opts.MaxHold {
			b.opts.Log.Warn("budget slot held longer than maxHold; letting it expire",
				zap.String("lease", h.name), zap.String("key", key))
			continue
		}
		leases := b.cs.CoordinationV1().Leases(b.opts.Namespace)
		l, err := leases.Get(ctx, h.name, metav1.GetOptions{})
		if err == nil && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != b.opts.Node) {
			b.opts.Log.Warn("budget slot lost (expired and retaken)", zap.String("lease", h.name), zap.String("key", key))
			b.mu.Lock()
			delete(b.held, key)
			b.mu.Unlock()
			continue
		}
		if err == nil {
			mt := metav1.NewMicroTime(now)
			l.Spec.RenewTime = &mt
			before := b.opts.Clock.Now()
			var written *coordv1.Lease
			if written, err = leases.Update(ctx, l, metav1.UpdateOptions{}); err == nil {
				b.obs.Wrote(written, before)
			}
		}
		if err != nil {
			b.opts.Log.Warn("renewing budget slot failed", zap.String("lease", h.name), zap.Error(err))
		}
	}
}

// Run renews held slots every TTL/3 until ctx ends.
func (b *Budget) Run(ctx context.Context) {
	t := b.opts.Clock.NewTicker(b.opts.TTL / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			b.Renew(ctx)
		}
	}
}
