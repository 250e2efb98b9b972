// Package fleetview reads back what the daemons already write to the
// cluster (the node condition, the Events on the Nodes, the budget and
// node-status Leases, the fleet pause ConfigMap) and turns it into one row
// per node: the view of `kubectl remediate fleet`. Nothing is executed on
// the nodes.
//
// Build is the pure part (objects and now in, a Fleet out); Collect reads
// the objects with paginated LISTs so that 5,000 nodes cost a handful of
// bounded requests, and keeps of them only what the view shows.
//
// A condition whose lastHeartbeatTime is older than Options.StaleAfter is
// shown as Unknown (Node.Stale, the written status in Node.Reported): the
// daemon that wrote it is gone (uninstalled without the cleanup hook,
// crash-looping, OOM-killed, cut off from the API), and nobody else
// rewrites a custom NodeCondition.
package fleetview

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// SchemaVersion is Fleet.SchemaVersion: it changes only when a field is
// removed or changes meaning (fields may be added).
const SchemaVersion = 1

// FutureSkew: a Lease renewed more than this after the view's time gets a
// warning (Fleet.Warnings).
const FutureSkew = time.Minute

// DefaultStaleAfter is Options.StaleAfter's default: three missed
// condition heartbeats (kubeexporter's default heartbeat is 5m), as the
// node lifecycle controller waits several missed kubelet heartbeats before
// it marks a node's Ready condition Unknown.
const DefaultStaleAfter = 15 * time.Minute

// Effective condition statuses beyond the NodeCondition's own.
const (
	// StatusNone: the node carries no condition (remediate never ran there,
	// or its cleanup removed it).
	StatusNone = "None"
)

// Options say where the daemons write and how old is stale.
type Options struct {
	// Namespace is the daemons' namespace: budget and node-status Leases,
	// the fleet pause ConfigMap.
	Namespace string
	// EventNamespace holds the Events about Nodes (kubeexporter's default
	// kube-system).
	EventNamespace string
	// ConditionType is the condition the daemons maintain.
	ConditionType string
	// Controller is the Events' reportingController.
	Controller string
	// StaleAfter: a condition heartbeat older than this is Unknown.
	StaleAfter time.Duration
}

// WithDefaults fills the zero fields.
func (o Options) WithDefaults() Options {
	if o.Namespace == "" {
		o.Namespace = "remediate"
	}
	if o.EventNamespace == "" {
		o.EventNamespace = "kube-system"
	}
	if o.ConditionType == "" {
		o.ConditionType = kubeexporter.DefaultConditionType
	}
	if o.Controller == "" {
		o.Controller = "remediate.dev/remediate"
	}
	if o.StaleAfter <= 0 {
		o.StaleAfter = DefaultStaleAfter
	}
	return o
}

// Fleet is the whole view; its JSON form is `kubectl remediate fleet -o
// json` (docs/FLEET.md).
type Fleet struct {
	SchemaVersion int       `json:"schemaVersion"`
	Time          time.Time `json:"time"`
	ConditionType string    `json:"conditionType"`
	// StaleAfter is Options.StaleAfter in seconds.
	StaleAfterSeconds int64  `json:"staleAfterSeconds"`
	Pause             Pause  `json:"pause"`
	Budget            []Slot `json:"budget"`
	Nodes             []Node `json:"nodes"`
	// Warnings are what could not be read (the view is then partial), and
	// Leases renewed more than FutureSkew after the view's time.
	Warnings []string `json:"warnings,omitempty"`
}

// Pause is the fleet pause (kube.FleetConfigMap).
type Pause struct {
	Paused bool   `json:"paused"`
	Reason string `json:"reason,omitempty"`
}

// Slot is one cluster budget slot Lease.
type Slot struct {
	Lease string `json:"lease"`
	// Holder is the node holding the slot; empty when it is free (released,
	// or expired: Expired).
	Holder  string     `json:"holder,omitempty"`
	Rule    string     `json:"rule,omitempty"`
	Target  string     `json:"target,omitempty"`
	Action  string     `json:"action,omitempty"`
	Since   *time.Time `json:"since,omitempty"`
	Renewed *time.Time `json:"renewed,omitempty"`
	Expired bool       `json:"expired,omitempty"`
}

// Node is one node's row.
type Node struct {
	Name string `json:"name"`
	// Status is the effective condition status: True, False, Unknown
	// (never judged, or Stale) or None (no condition).
	Status string `json:"status"`
	// Reported is the status written on the Node (differs from Status
	// when Stale).
	Reported string `json:"reported,omitempty"`
	// Stale: the heartbeat is older than StaleAfter (or missing).
	Stale   bool       `json:"stale,omitempty"`
	Reason  string     `json:"reason,omitempty"`
	Message string     `json:"message,omitempty"`
	Since   *time.Time `json:"since,omitempty"`
	// Heartbeat is the condition's lastHeartbeatTime.
	Heartbeat *time.Time `json:"heartbeat,omitempty"`
	// DaemonRenewed is the node-status Lease's renewTime (the storm guard's
	// liveness, renewed every few minutes while the daemon runs).
	DaemonRenewed *time.Time `json:"daemonRenewed,omitempty"`
	// Firing are the rules the node-status Lease says fire there.
	Firing []string `json:"firing,omitempty"`
	// TopFinding is the first problem of a False condition's message, else
	// the firing rules.
	TopFinding string  `json:"topFinding,omitempty"`
	LastAction *Action `json:"lastAction,omitempty"`
	// BudgetSlots are the budget Leases this node holds (unexpired).
	BudgetSlots []string `json:"budgetSlots,omitempty"`
}

// Action is the newest remediation Event about a node.
type Action struct {
	Time time.Time `json:"time"`
	// Reason is the Event's reason (kubeexporter.ReasonExecuted, ...).
	Reason string `json:"reason"`
	// Outcome is the short form: executed, dry-run, failed, escalated,
	// storm, uncordoned.
	Outcome string `json:"outcome"`
	Action  string `json:"action"`
	Note    string `json:"note,omitempty"`
	Count   int32  `json:"count"`
}

// outcomes are the Event reasons that record an action, by outcome.
var outcomes = map[string]string{
	kubeexporter.ReasonExecuted:  "executed",
	kubeexporter.ReasonDryRun:    "dry-run",
	kubeexporter.ReasonFailed:    "failed",
	kubeexporter.ReasonEscalated: "escalated",
	kubeexporter.ReasonStorm:     "storm",
	kubeexporter.ReasonUncordon:  "uncordoned",
}

// IsActionEvent says whether ev is a remediation Event of controller about
// a Node (the ones Build shows as LastAction), reported by that node's own
// daemon: its reportingInstance is kubeexporter.ReportingInstance, as
// kubeexporter writes it and as deploy/'s admission policy makes the
// daemon on each node write it. An Event about one node that another
// writer reported (another node's token, or anyone else allowed to create
// Events) is not that node's action.
func IsActionEvent(ev *eventsv1.Event, controller string) bool {
	_, ok := outcomes[ev.Reason]
	return ok && ev.ReportingController == controller && ev.Regarding.Kind == "Node" && ev.Regarding.Name != "" &&
		ev.ReportingInstance == kubeexporter.ReportingInstance(controller, ev.Regarding.Name)
}

// EventTime is when ev last happened: its series' last observation, else
// its eventTime, else its creation.
func EventTime(ev *eventsv1.Event) time.Time {
	switch {
	case ev.Series != nil && !ev.Series.LastObservedTime.IsZero():
		return ev.Series.LastObservedTime.Time
	case !ev.EventTime.IsZero():
		return ev.EventTime.Time
	}
	return ev.CreationTimestamp.Time
}

// Inputs are the objects Build reads. Nodes may be stripped to their name
// and the condition (Collect keeps no more); Events may be any Events (only
// action Events count).
type Inputs struct {
	Nodes  []corev1.Node
	Events []eventsv1.Event
	Leases []coordv1.Lease
	// Pause is the fleet ConfigMap (nil: absent).
	Pause    *corev1.ConfigMap
	Warnings []string
}

// Build is the view of in at now. Rows are sorted by node name.
func Build(in Inputs, now time.Time, o Options) Fleet {
	o = o.WithDefaults()
	f := Fleet{SchemaVersion: SchemaVersion, Time: now.UTC(), ConditionType: o.ConditionType,
		StaleAfterSeconds: int64(o.StaleAfter / time.Second), Budget: []Slot{}, Nodes: []Node{},
		Warnings: in.Warnings}
	f.Pause.Paused, f.Pause.Reason = kube.Paused(in.Pause)

	last := map[string]*eventsv1.Event{}
	for i := range in.Events {
		ev := &in.Events[i]
		if !IsActionEvent(ev, o.Controller) {
			continue
		}
		if p := last[ev.Regarding.Name]; p == nil || EventTime(ev).After(EventTime(p)) {
			last[ev.Regarding.Name] = ev
		}
	}
	status := map[string]*coordv1.Lease{}
	held := map[string][]string{}
	for i := range in.Leases {
		l := &in.Leases[i]
		if r := l.Spec.RenewTime; r != nil && r.Sub(now) > FutureSkew {
			// The view judges by the Lease's own times; the daemons by
			// when they saw it renewed (guardrails.Observed).
			f.Warnings = append(f.Warnings, fmt.Sprintf("Lease %s (holder %s) renewed %s, %v after now: its holder's clock runs ahead, or it is forged; the daemons count it for one duration after they see it renewed, not until then",
				l.Name, ptr.Deref(l.Spec.HolderIdentity, ""), r.UTC().Format(time.RFC3339), r.Sub(now).Round(time.Second)))
		}
		switch l.Labels[guardrails.LabelLease] {
		case guardrails.LeaseNodeStatus:
			// Only the holder's own Lease speaks for it (the admission
			// policy lets each node write only remediate-node-<itself>).
			if h := l.Spec.HolderIdentity; h != nil && l.Name == guardrails.StatusLeaseName(*h) {
				status[*h] = l
			}
		case guardrails.LeaseBudget:
			s := Slot{Lease: l.Name}
			free := guardrails.SlotFree(l, now)
			if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
				if free {
					s.Expired = true
				} else {
					s.Holder = *l.Spec.HolderIdentity
					s.Rule, s.Target, s.Action = l.Annotations[guardrails.AnnotationRule], l.Annotations[guardrails.AnnotationTarget], l.Annotations[guardrails.AnnotationAction]
					held[s.Holder] = append(held[s.Holder], l.Name)
				}
			}
			s.Since, s.Renewed = microTime(l.Spec.AcquireTime), microTime(l.Spec.RenewTime)
			f.Budget = append(f.Budget, s)
		}
	}
	sort.Slice(f.Budget, func(i, j int) bool { return f.Budget[i].Lease < f.Budget[j].Lease })

	for i := range in.Nodes {
		n := &in.Nodes[i]
		row := Node{Name: n.Name, Status: StatusNone, BudgetSlots: held[n.Name]}
		for _, c := range n.Status.Conditions {
			if string(c.Type) != o.ConditionType {
				continue
			}
			row.Status, row.Reported = string(c.Status), string(c.Status)
			row.Reason, row.Message = c.Reason, c.Message
			row.Since = metaTime(c.LastTransitionTime.Time)
			row.Heartbeat = metaTime(c.LastHeartbeatTime.Time)
			if c.LastHeartbeatTime.IsZero() || now.Sub(c.LastHeartbeatTime.Time) > o.StaleAfter {
				row.Stale, row.Status = true, string(corev1.ConditionUnknown)
			}
		}
		if l := status[n.Name]; l != nil {
			row.DaemonRenewed = microTime(l.Spec.RenewTime)
			var firing []string
			if json.Unmarshal([]byte(l.Annotations[guardrails.AnnotationFiring]), &firing) == nil && !guardrails.SlotFree(l, now) {
				row.Firing = firing
			}
		}
		switch {
		case row.Reported == string(corev1.ConditionFalse) && row.Message != "":
			row.TopFinding, _, _ = strings.Cut(row.Message, "; ")
		case len(row.Firing) > 0:
			row.TopFinding = "firing: " + strings.Join(row.Firing, ", ")
		}
		if ev := last[n.Name]; ev != nil {
			count := int32(1)
			if ev.Series != nil && ev.Series.Count > 0 {
				count = ev.Series.Count
			}
			row.LastAction = &Action{Time: EventTime(ev).UTC(), Reason: ev.Reason, Outcome: outcomes[ev.Reason],
				Action: ev.Action, Note: ev.Note, Count: count}
		}
		f.Nodes = append(f.Nodes, row)
	}
	sort.Slice(f.Nodes, func(i, j int) bool { return f.Nodes[i].Name < f.Nodes[j].Name })
	return f
}

func metaTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func microTime(t *metav1.MicroTime) *time.Time {
	if t == nil {
		return nil
	}
	return metaTime(t.Time)
}
