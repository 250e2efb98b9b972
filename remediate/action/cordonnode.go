package action

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// CordonNodeParams are the bounds of CordonNode.
type CordonNodeParams struct {
	// Enabled must be set: cordoning is off by default.
	Enabled bool `yaml:"enabled"`
	// Taint, if set, is added with the cordon and removed with it.
	Taint *TaintParams `yaml:"taint,omitempty"`
}

// TaintParams is a taint to add.
type TaintParams struct {
	Key    string `yaml:"key"`
	Value  string `yaml:"value"`
	Effect string `yaml:"effect"` // NoSchedule, PreferNoSchedule, NoExecute
}

// Validate implements policy.Validator.
func (p *CordonNodeParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Taint != nil {
		if msgs := validation.IsQualifiedName(p.Taint.Key); len(msgs) > 0 {
			errs = append(errs, policy.FieldError{Field: "taint.key", Msg: msgs[0]})
		}
		if p.Taint.Value != "" {
			if msgs := validation.IsValidLabelValue(p.Taint.Value); len(msgs) > 0 {
				errs = append(errs, policy.FieldError{Field: "taint.value", Msg: msgs[0]})
			}
		}
		switch corev1.TaintEffect(p.Taint.Effect) {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
		default:
			errs = append(errs, policy.FieldError{Field: "taint.effect", Msg: "must be NoSchedule, PreferNoSchedule or NoExecute"})
		}
	}
	return errs
}

func init() {
	Define("CordonNode",
		"cordons this node (optionally tainting it) and uncordons it once the finding has resolved; off unless enabled",
		newCordonNode, Disruptive(), NeedsAPI(), ActsOnAnyFinding())
}

type cordonNode struct {
	p CordonNodeParams
	n *node.Node
}

func newCordonNode(p *CordonNodeParams, n *node.Node) (Action, error) {
	return &cordonNode{p: *p, n: n}, nil
}

func (a *cordonNode) taint() *corev1.Taint {
	if a.p.Taint == nil {
		return nil
	}
	return &corev1.Taint{Key: a.p.Taint.Key, Value: a.p.Taint.Value, Effect: corev1.TaintEffect(a.p.Taint.Effect)}
}

func (a *cordonNode) check(ctx context.Context) (*corev1.Node, error) {
	if !a.p.Enabled {
		return nil, finding.Skip("CordonNode is off (set enabled: true in the rule's action to allow it)")
	}
	if a.n.Kube == nil {
		return nil, finding.Skip("%s", a.n.Why("kubernetes"))
	}
	nd, err := a.n.Kube.CoreV1().Nodes().Get(ctx, a.n.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading node %s: %w", a.n.Name, err)
	}
	if rec, ours := kube.CordonedBy(nd); ours {
		return nil, finding.Skip("node %s is already cordoned by remediate (%s on %s)", a.n.Name, rec.Detector, rec.Target)
	}
	if nd.Spec.Unschedulable {
		return nil, finding.Skip("node %s is already cordoned by someone else; leaving it alone", a.n.Name)
	}
	return nd, nil
}

func (a *cordonNode) Plan(ctx context.Context, _ finding.Finding) (Plan, error) {
	if _, err := a.check(ctx); err != nil {
		return Plan{}, err
	}
	s := fmt.Sprintf("cordon node %s", a.n.Name)
	if t := a.taint(); t != nil {
		s += fmt.Sprintf(" and taint it %s=%s:%s", t.Key, t.Value, t.Effect)
	}
	return Plan{Summary: s + " (undone when the finding resolves)"}, nil
}

func (a *cordonNode) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	if _, err := a.check(ctx); err != nil {
		return Result{}, err
	}
	var clk clock.PassiveClock = clock.RealClock{}
	if a.n.Clock != nil {
		clk = a.n.Clock
	}
	prev, err := kube.Cordon(ctx, a.n.Kube, a.n.Name, kube.CordonRecord{Detector: f.Detector, Target: f.Target, Time: clk.Now(), Taint: a.taint()})
	if errors.Is(err, kube.ErrCordonedByOther) {
		return Result{}, finding.Skip("node %s was cordoned by someone else meanwhile; leaving it alone", a.n.Name)
	}
	if err != nil {
		return Result{}, err
	}
	return Result{Summary: fmt.Sprintf("cordoned node %s", a.n.Name),
		Details: map[string]any{"previousUnschedulable": prev, "annotation": kube.AnnotationCordonedBy}}, nil
}
