// Package kubeexporter publishes the daemon's decisions to the cluster: an Event
// (events.k8s.io/v1) on the Node for every executed, dry-run, failed or
// escalated decision (and storm hold-backs), deduplicated into series; the
// KubeProxyDataplaneHealthy NodeCondition, turned with hysteresis as
// node-problem-detector does; the node's firing rules for the storm guard;
// and the undoing of remediate's own cordon once its rule has resolved.
//
// The daemon calls Reporter.Report once per cycle with the cycle's report.
// API failures never stop the loop: what could not be written is retried
// next cycle.
//
// An Event series is counted every cycle but written at most every
// SeriesInterval (default 5 minutes): a finding that lasts no longer
// patches its Event every cycle (1.5 writes a minute per node in
// bench-fleet), and the count written is the true one when it is written.
// Flush writes the counts still pending (the daemon calls it at shutdown).
package kubeexporter

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// Event reasons.
const (
	ReasonExecuted  = "RemediationExecuted"
	ReasonDryRun    = "RemediationDryRun"
	ReasonFailed    = "RemediationFailed"
	ReasonEscalated = "RemediationEscalated"
	ReasonStorm     = "RemediationStormSuspected"
	ReasonUncordon  = "RemediationUncordoned"
	ReasonProblem   = "KubeProxyDataplaneProblem"
)

// DefaultConditionType is the NodeCondition the reporter maintains.
const DefaultConditionType = "KubeProxyDataplaneHealthy"

// Options configure a Reporter.
type Options struct {
	// Node is this node's name.
	Node string
	// EventNamespace holds the Events about the (cluster-scoped) Node:
	// the apiserver accepts "default" or "kube-system" for them; default
	// kube-system, where the DaemonSet runs, so one Role covers it.
	EventNamespace string
	// Controller is the events' reportingController (default
	// "remediate.dev/remediate").
	Controller string
	// DedupWindow: the same rule, target and outcome within this window is
	// one Event whose series count grows (default 10m).
	DedupWindow time.Duration
	// SeriesInterval: a series' count and lastObservedTime are written at
	// most this often (default 5m), and at the latest SeriesInterval after
	// its last occurrence, so the count on the server is at most
	// SeriesInterval behind. 5 minutes is the Node condition's heartbeat
	// (the two views of a lasting finding are equally fresh), well inside
	// the apiserver's Event TTL (--event-ttl, 1h: a written series is kept
	// alive), and one write per 10 cycles of 30 s; client-go's
	// tools/events writes isomorphic series every 30 minutes, which would
	// leave "last seen" half an hour behind on a finding still firing.
	SeriesInterval time.Duration
	// ConditionType (default KubeProxyDataplaneHealthy); empty rules means
	// every finding of severity >= MinSeverity counts, else only those of
	// ConditionRules.
	ConditionType  string
	ConditionRules []string
	MinSeverity    finding.Severity
	Hysteresis     Hysteresis
	// Heartbeat rewrites the condition at least this often, refreshing
	// lastHeartbeatTime (default 5m).
	Heartbeat time.Duration
	// RewriteAfter debounces the condition's rewrites for other problems
	// under the same status (a new reason or set of targets while False):
	// written at most once per RewriteAfter since the last write (default
	// 1m), the latest set then; a change of status is written at once.
	// Under churn the problems change most cycles, on every loaded node.
	RewriteAfter time.Duration
	// UncordonAfter: remediate's cordon is undone once its rule has had no
	// finding (its detector having run) for this long (default 2m).
	UncordonAfter time.Duration
	// Firing, if set, publishes the rules firing on this node each cycle
	// (guardrails.Storm.Publish).
	Firing func(ctx context.Context, rules []string) error
	// Nodes, if set, is the watched Node (kube.NodeWatch): the per-cycle
	// cordon check reads it instead of GETting the Node.
	Nodes interface {
		Node() (*corev1.Node, bool)
	}
	Clock clock.PassiveClock
	Log   *zap.Logger
}

// Reporter publishes reports. It is goroutine-safe.
type Reporter struct {
	cs   kubernetes.Interface
	opts Options

	mu         sync.Mutex
	series     map[string]*seriesState
	cond       ConditionState
	condLoaded bool
	condDirty  bool
	lastWrite  time.Time
	// written is the status last written (the debounce keeps a status
	// change immediate).
	written    corev1.ConditionStatus
	cleanSince map[string]time.Time // cordon rule → first cycle without its finding
}

// seriesState is one Event series: count occurrences, of which written
// are on the server (written at wrote); last is the last occurrence.
type seriesState struct {
	name    string
	count   int32
	written int32
	first   time.Time
	last    time.Time
	wrote   time.Time
}

// New returns a Reporter writing through cs.
func New(cs kubernetes.Interface, o Options) *Reporter {
	if o.EventNamespace == "" {
		o.EventNamespace = metav1.NamespaceSystem
	}
	if o.Controller == "" {
		o.Controller = "remediate.dev/remediate"
	}
	if o.DedupWindow <= 0 {
		o.DedupWindow = 10 * time.Minute
	}
	if o.SeriesInterval <= 0 {
		o.SeriesInterval = 5 * time.Minute
	}
	if o.ConditionType == "" {
		o.ConditionType = DefaultConditionType
	}
	if o.MinSeverity == "" {
		o.MinSeverity = finding.Warning
	}
	if o.Hysteresis == (Hysteresis{}) {
		o.Hysteresis = Hysteresis{ProblemAfter: time.Minute, ClearAfter: 5 * time.Minute}
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 5 * time.Minute
	}
	if o.RewriteAfter <= 0 {
		o.RewriteAfter = time.Minute
	}
	if o.UncordonAfter <= 0 {
		o.UncordonAfter = 2 * time.Minute
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	return &Reporter{cs: cs, opts: o, series: map[string]*seriesState{}, cleanSince: map[string]time.Time{}}
}

// Report publishes one cycle's report: events, condition, firing rules,
// uncordon. It returns the joined errors; the caller logs them.
func (r *Reporter) Report(ctx context.Context, rep *remediate.Report) error {
	var errs []error
	for _, d := range rep.Decisions {
		if err := r.event(ctx, d); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.condition(ctx, rep); err != nil {
		errs = append(errs, err)
	}
	if r.opts.Firing != nil {
		rules := map[string]bool{}
		for _, f := range rep.Findings {
			if f.Detector != remediate.SelfDetector {
				rules[f.Rule] = true
			}
		}
		list := make([]string, 0, len(rules))
		for k := range rules {
			list = append(list, k)
		}
		sort.Strings(list)
		if err := r.opts.Firing(ctx, list); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.uncordon(ctx, rep); err != nil {
		errs = append(errs, err)
	}
	if err := r.flush(ctx, false); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Flush writes the series counts not yet written (at shutdown: the
// occurrences since the last write are otherwise lost).
func (r *Reporter) Flush(ctx context.Context) error {
	return r.flush(ctx, true)
}

// flush writes the series with unwritten occurrences that are due (their
// last write SeriesInterval ago, or their last occurrence about to be
// forgotten), or all of them, then forgets the series whose last
// occurrence is older than DedupWindow.
func (r *Reporter) flush(ctx context.Context, all bool) error {
	now := r.opts.Clock.Now()
	type due struct {
		s     *seriesState
		count int32
		last  time.Time
	}
	var todo []due
	r.mu.Lock()
	for _, s := range r.series {
		if s.count > s.written && (all || now.Sub(s.wrote) >= r.opts.SeriesInterval || now.Sub(s.last) > r.opts.DedupWindow) {
			todo = append(todo, due{s, s.count, s.last})
		}
	}
	r.mu.Unlock()
	sort.Slice(todo, func(i, j int) bool { return todo[i].s.name < todo[j].s.name })
	var errs []error
	for _, d := range todo {
		if err := r.patchSeries(ctx, d.s, d.count, d.last, now); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	r.mu.Lock()
	for k, s := range r.series { // forget expired series
		if now.Sub(s.last) > r.opts.DedupWindow {
			delete(r.series, k)
		}
	}
	r.mu.Unlock()
	return errors.Join(errs...)
}

// patchSeries writes count and lastObservedTime last to s's Event.
func (r *Reporter) patchSeries(ctx context.Context, s *seriesState, count int32, last, now time.Time) error {
	patch := fmt.Sprintf(`{"series":{"count":%d,"lastObservedTime":%q}}`, count,
		metav1.NewMicroTime(last).UTC().Format(metav1.RFC3339Micro))
	_, err := r.cs.EventsV1().Events(r.opts.EventNamespace).Patch(ctx, s.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("updating event series %s/%s: %w", r.opts.EventNamespace, s.name, err)
	}
	r.mu.Lock()
	if count > s.written {
		s.written = count
	}
	s.wrote = now
	r.mu.Unlock()
	return nil
}

// eventFor maps a decision to (type, reason); ok false = no event.
func eventFor(d remediate.Decision) (typ, reason, outcome string, ok bool) {
	switch {
	case d.Phase == remediate.PhaseEscalated && d.Outcome != remediate.OutcomeSkipped:
		return corev1.EventTypeWarning, ReasonEscalated, "escalated", true
	case d.Outcome == remediate.OutcomeExecuted:
		return corev1.EventTypeNormal, ReasonExecuted, string(d.Outcome), true
	case d.Outcome == remediate.OutcomeDryRun:
		return corev1.EventTypeNormal, ReasonDryRun, string(d.Outcome), true
	case d.Outcome == remediate.OutcomeFailed:
		return corev1.EventTypeWarning, ReasonFailed, string(d.Outcome), true
	case d.Outcome == remediate.OutcomeBlocked && d.Guardrail == guardrails.GuardStorm:
		return corev1.EventTypeWarning, ReasonStorm, "storm", true
	}
	return "", "", "", false
}

func (r *Reporter) event(ctx context.Context, d remediate.Decision) error {
	typ, reason, outcome, ok := eventFor(d)
	if !ok {
		return nil
	}
	note := fmt.Sprintf("rule %s, target %s: %s", d.Rule, d.Target, d.Reason)
	action := d.Action
	if action == "" {
		action = "Report"
	}
	return r.Emit(ctx, guardrails.TargetKey(d.Rule, d.Target)+"|"+outcome, typ, reason, action, note)
}

// Emit records one occurrence of an event with dedup key key: the first in
// DedupWindow creates an Event, the following ones count in its series,
// written at most every SeriesInterval (and by Report's and Flush's
// writes of the counts due).
func (r *Reporter) Emit(ctx context.Context, key, typ, reason, action, note string) error {
	now := r.opts.Clock.Now()
	r.mu.Lock()
	s := r.series[key]
	if s != nil && now.Sub(s.last) > r.opts.DedupWindow {
		s = nil // expired: a new Event (its pending count was written by flush)
	}
	var count int32
	write := false
	if s != nil {
		s.count++
		s.last = now
		count = s.count
		write = now.Sub(s.wrote) >= r.opts.SeriesInterval
	}
	r.mu.Unlock()
	events := r.cs.EventsV1().Events(r.opts.EventNamespace)
	if s != nil {
		if !write {
			return nil
		}
		err := r.patchSeries(ctx, s, count, now, now)
		if err == nil || !apierrors.IsNotFound(err) {
			return err
		}
		// The event expired on the server: start a new one.
	}
	if len(note) > 1024 {
		note = note[:1021] + "..."
	}
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      fmt.Sprintf("%s.%x", r.opts.Node, now.UnixNano()),
			Namespace: r.opts.EventNamespace,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: r.opts.Controller,
		ReportingInstance:   ReportingInstance(r.opts.Controller, r.opts.Node),
		Action:              truncate(action, 128),
		Reason:              reason,
		Type:                typ,
		Note:                note,
		// The kubelet's convention for Node events: UID = node name, so
		// `kubectl describe node` lists them.
		Regarding: corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: r.opts.Node, UID: types.UID(r.opts.Node)},
	}
	created, err := events.Create(ctx, ev, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating event %s on node %s: %w", reason, r.opts.Node, err)
	}
	r.mu.Lock()
	r.series[key] = &seriesState{name: created.Name, count: 1, written: 1, first: now, last: now, wrote: now}
	r.mu.Unlock()
	return nil
}

// ReportingInstance is the reportingInstance of the Events the daemon on
// node writes: controller-node, cut to 128 bytes (the API's limit). deploy/'s
// admission policy lets the daemon write no other, and the fleet view
// (fleetview.IsActionEvent) takes an Event about a node as that node's
// action only with it.
func ReportingInstance(controller, node string) string {
	return truncate(controller+"-"+node, 128)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

func severityRank(s finding.Severity) int {
	switch s {
	case finding.Critical:
		return 3
	case finding.Warning:
		return 2
	case finding.Info:
		return 1
	}
	return 0
}

// problem summarises the findings that count against the condition: the
// reason, the key of the problems (each "rule: target", sorted) and the
// message.
func (r *Reporter) problem(rep *remediate.Report) (bool, string, string, string) {
	only := map[string]bool{}
	for _, x := range r.opts.ConditionRules {
		only[x] = true
	}
	var parts, keys []string
	detectors := map[string]bool{}
	for _, f := range rep.Findings {
		if f.Detector == remediate.SelfDetector || severityRank(f.Severity) < severityRank(r.opts.MinSeverity) {
			continue
		}
		if len(only) > 0 && !only[f.Rule] {
			continue
		}
		detectors[f.Detector] = true
		parts = append(parts, fmt.Sprintf("%s: %s: %s", f.Rule, f.Target, f.Message))
		keys = append(keys, f.Rule+": "+f.Target)
	}
	if len(parts) == 0 {
		return false, "", "", ""
	}
	sort.Strings(parts)
	sort.Strings(keys)
	reason := "MultipleProblems"
	if len(detectors) == 1 {
		for d := range detectors {
			reason = d
		}
	}
	msg := strings.Join(parts, "; ")
	if len(msg) > 1024 {
		msg = msg[:1021] + "..."
	}
	return true, reason, strings.Join(keys, "; "), msg
}

func (r *Reporter) condition(ctx context.Context, rep *remediate.Report) error {
	now := r.opts.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.condLoaded {
		// Start from what is on the Node, so a restart does not flip a
		// False condition to True without the ClearAfter wait.
		n, err := r.cs.CoreV1().Nodes().Get(ctx, r.opts.Node, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s: %w", r.opts.Node, err)
		}
		for _, c := range n.Status.Conditions {
			if string(c.Type) == r.opts.ConditionType {
				r.cond = ConditionState{Status: c.Status, Reason: c.Reason, Message: c.Message, Transition: c.LastTransitionTime.Time}
				if c.Status == corev1.ConditionFalse {
					r.cond.ProblemSince = c.LastTransitionTime.Time
				}
			}
		}
		r.condLoaded = true
	}
	problem, reason, key, msg := r.problem(rep)
	next, changed := NextCondition(r.cond, problem, reason, key, msg, now, r.opts.Hysteresis)
	r.cond = next
	if changed {
		r.condDirty = true
	}
	if next.Status == "" || (!r.condDirty && now.Sub(r.lastWrite) < r.opts.Heartbeat) {
		return nil
	}
	if r.condDirty && next.Status == r.written && now.Sub(r.lastWrite) < r.opts.RewriteAfter {
		return nil // other problems, same status: debounced (stays dirty)
	}
	c := corev1.NodeCondition{
		Type: corev1.NodeConditionType(r.opts.ConditionType), Status: next.Status, Reason: next.Reason, Message: next.Message,
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(next.Transition),
	}
	if err := patchCondition(ctx, r.cs, r.opts.Node, c); err != nil {
		return err // stays dirty: retried next cycle
	}
	if changed || r.condDirty {
		typ := corev1.EventTypeNormal
		if next.Status == corev1.ConditionFalse {
			typ = corev1.EventTypeWarning
		}
		r.mu.Unlock()
		err := r.Emit(ctx, "condition|"+string(next.Status)+"|"+next.Reason, typ, ReasonProblem, "SetCondition",
			fmt.Sprintf("%s=%s (%s): %s", r.opts.ConditionType, next.Status, next.Reason, next.Message))
		r.mu.Lock()
		if err != nil {
			r.opts.Log.Warn("condition event failed", zap.Error(err))
		}
	}
	r.condDirty, r.lastWrite, r.written = false, now, next.Status
	return nil
}

// patchCondition sets one condition through the nodes/status subresource
// with a strategic merge patch (conditions merge on type), leaving the
// kubelet's conditions alone.
func patchCondition(ctx context.Context, cs kubernetes.Interface, node string, c corev1.NodeCondition) error {
	body := map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{c}}}
	js, err := jsonMarshal(body)
	if err != nil {
		return err
	}
	if _, err := cs.CoreV1().Nodes().PatchStatus(ctx, node, js); err != nil {
		return fmt.Errorf("setting condition %s on node %s: %w", c.Type, node, err)
	}
	return nil
}

// uncordon undoes remediate's cordon once the finding that caused it
// (detector and target) has been absent for UncordonAfter while its
// detector ran.
func (r *Reporter) uncordon(ctx context.Context, rep *remediate.Report) error {
	var n *corev1.Node
	if r.opts.Nodes != nil {
		var ok bool
		if n, ok = r.opts.Nodes.Node(); !ok {
			return nil
		}
	} else {
		var err error
		if n, err = r.cs.CoreV1().Nodes().Get(ctx, r.opts.Node, metav1.GetOptions{}); err != nil {
			return fmt.Errorf("reading node %s: %w", r.opts.Node, err)
		}
	}
	rec, ours := kube.CordonedBy(n)
	key := rec.Detector + "|" + rec.Target
	r.mu.Lock()
	if !ours {
		r.cleanSince = map[string]time.Time{}
		r.mu.Unlock()
		return nil
	}
	now := r.opts.Clock.Now()
	firing := false
	for _, f := range rep.Findings {
		if f.Detector == rec.Detector && f.Target == rec.Target {
			firing = true
		}
	}
	for _, s := range rep.Skipped {
		if s.Detector == rec.Detector {
			firing = true // cannot tell: keep the cordon
		}
	}
	// An unreadable record, or a detector no rule runs any more, would
	// never clear: keep the cordon and say so.
	ran := rec.Detector != "unknown"
	if firing || !ran {
		delete(r.cleanSince, key)
		r.mu.Unlock()
		return nil
	}
	since, ok := r.cleanSince[key]
	if !ok {
		r.cleanSince[key] = now
		since = now
	}
	r.mu.Unlock()
	if now.Sub(since) < r.opts.UncordonAfter {
		return nil
	}
	changed, err := kube.Uncordon(ctx, r.cs, r.opts.Node)
	if err != nil {
		return err
	}
	if changed {
		r.mu.Lock()
		delete(r.cleanSince, key)
		r.mu.Unlock()
		r.opts.Log.Info("uncordoned node: the finding that cordoned it has resolved", zap.String("detector", rec.Detector), zap.String("target", rec.Target))
		return r.Emit(ctx, "uncordon|"+key, corev1.EventTypeNormal, ReasonUncordon, "Uncordon",
			fmt.Sprintf("%s on %s resolved (no finding for %s): uncordoned the node remediate cordoned at %s",
				rec.Detector, rec.Target, r.opts.UncordonAfter, rec.Time.UTC().Format(time.RFC3339)))
	}
	return nil
}
