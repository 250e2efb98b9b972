package fleetview

import (
	"context"
	"fmt"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// DefaultPageSize is the LIST page size (limit/continue): 5,000 Nodes are
// 10 requests, each answer a few MB at most.
const DefaultPageSize = 500

// MaxPages bounds each paginated LIST (DefaultPageSize × MaxPages = 500,000
// objects): a server that keeps answering with a continue token does not
// keep the view reading for ever.
const MaxPages = 1000

// CollectOptions bound Collect.
type CollectOptions struct {
	Options
	// PageSize is the LIST limit (default DefaultPageSize).
	PageSize int64
	// NodeSelector restricts the Nodes (a label selector; "" all).
	NodeSelector string
}

// Stats are what Collect requested, for the tests and -v.
type Stats struct {
	Requests            int
	Nodes, Events, Seen int
}

// Collect reads the fleet's objects and builds the view at now. Nodes and
// Events are listed page by page, each page reduced at once to what the
// view keeps (a Node's name and its condition; per node the newest action
// Event), so memory stays bounded by the node count, not the Events'.
// A LIST that fails (RBAC, timeout) leaves a warning and a partial view;
// only the Nodes are required. ctx bounds the whole.
func Collect(ctx context.Context, cs kubernetes.Interface, o CollectOptions, now time.Time) (Fleet, Stats, error) {
	o.Options = o.Options.WithDefaults()
	if o.PageSize <= 0 {
		o.PageSize = DefaultPageSize
	}
	var in Inputs
	var st Stats

	err := pages(ctx, &st, func(opts metav1.ListOptions) (string, error) {
		opts.LabelSelector = o.NodeSelector
		l, err := cs.CoreV1().Nodes().List(ctx, withLimit(opts, o.PageSize))
		if err != nil {
			return "", err
		}
		for i := range l.Items {
			in.Nodes = append(in.Nodes, stripNode(&l.Items[i], o.ConditionType))
		}
		return l.Continue, nil
	})
	if err != nil {
		return Fleet{}, st, fmt.Errorf("listing nodes: %w", err)
	}
	st.Nodes = len(in.Nodes)

	newest := map[string]eventsv1.Event{}
	sel := fields.Set{"reportingController": o.Controller, "regarding.kind": "Node"}.AsSelector().String()
	err = pages(ctx, &st, func(opts metav1.ListOptions) (string, error) {
		opts.FieldSelector = sel
		l, err := cs.EventsV1().Events(o.EventNamespace).List(ctx, withLimit(opts, o.PageSize))
		if err != nil {
			return "", err
		}
		for i := range l.Items {
			ev := &l.Items[i]
			st.Events++
			if !IsActionEvent(ev, o.Controller) {
				continue
			}
			if p, ok := newest[ev.Regarding.Name]; !ok || EventTime(ev).After(EventTime(&p)) {
				newest[ev.Regarding.Name] = stripEvent(ev)
			}
		}
		return l.Continue, nil
	})
	if err != nil {
		in.Warnings = append(in.Warnings, fmt.Sprintf("events in %s not read (no last action shown): %v", o.EventNamespace, err))
	}
	for _, ev := range newest {
		in.Events = append(in.Events, ev)
	}

	// Both kinds carry the label (the selector "key" means: has it).
	leaseSel := guardrails.LabelLease
	err = pages(ctx, &st, func(opts metav1.ListOptions) (string, error) {
		opts.LabelSelector = leaseSel
		l, err := cs.CoordinationV1().Leases(o.Namespace).List(ctx, withLimit(opts, o.PageSize))
		if err != nil {
			return "", err
		}
		for i := range l.Items {
			in.Leases = append(in.Leases, stripLease(&l.Items[i]))
		}
		return l.Continue, nil
	})
	if err != nil {
		in.Warnings = append(in.Warnings, fmt.Sprintf("leases in %s not read (no budget, no daemon liveness shown): %v", o.Namespace, err))
	}

	st.Requests++
	cm, err := cs.CoreV1().ConfigMaps(o.Namespace).Get(ctx, kube.FleetConfigMap, metav1.GetOptions{})
	switch {
	case err == nil:
		in.Pause = cm
	case apierrors.IsNotFound(err):
	default:
		in.Warnings = append(in.Warnings, fmt.Sprintf("fleet pause ConfigMap %s/%s not read (pause unknown): %v", o.Namespace, kube.FleetConfigMap, err))
	}
	return Build(in, now, o.Options), st, nil
}

func withLimit(o metav1.ListOptions, n int64) metav1.ListOptions {
	o.Limit = n
	return o
}

// pages runs a paginated LIST: list is called with the continue token of
// the previous page until the server returns none, at most MaxPages times.
// A continue token that expired (410) is an error, not a restart: the
// view would count objects twice.
func pages(ctx context.Context, st *Stats, list func(metav1.ListOptions) (string, error)) error {
	cont := ""
	for i := 0; i < MaxPages; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		st.Requests++
		next, err := list(metav1.ListOptions{Continue: cont})
		if err != nil {
			return err
		}
		if next == "" {
			return nil
		}
		cont = next
	}
	return fmt.Errorf("more than %d pages", MaxPages)
}

// stripNode keeps a Node's name and the condition typ.
func stripNode(n *corev1.Node, typ string) corev1.Node {
	out := corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name}}
	for _, c := range n.Status.Conditions {
		if string(c.Type) == typ {
			out.Status.Conditions = []corev1.NodeCondition{c}
		}
	}
	return out
}

func stripEvent(ev *eventsv1.Event) eventsv1.Event {
	return eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: ev.Name, CreationTimestamp: ev.CreationTimestamp},
		EventTime: ev.EventTime, Series: ev.Series, ReportingController: ev.ReportingController, ReportingInstance: ev.ReportingInstance,
		Action: ev.Action, Reason: ev.Reason, Note: ev.Note, Type: ev.Type,
		Regarding: corev1.ObjectReference{Kind: ev.Regarding.Kind, Name: ev.Regarding.Name}}
}

func stripLease(l *coordv1.Lease) coordv1.Lease {
	return coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: l.Name, Labels: l.Labels, Annotations: l.Annotations}, Spec: l.Spec}
}
