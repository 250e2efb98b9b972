package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// AnnotationCordonedBy on a Node records that remediate cordoned it (and
// why), so the cordon is undone when the rule resolves, also after a
// daemon restart. A node cordoned by anyone else never carries it and is
// never uncordoned by remediate.
const AnnotationCordonedBy = "remediate.dev/cordoned-by"

// CordonRecord is the JSON value of AnnotationCordonedBy.
type CordonRecord struct {
	// Detector and Target identify the finding that caused the cordon:
	// once no finding of that detector on that target is seen, the cordon
	// is undone.
	Detector string    `json:"detector"`
	Target   string    `json:"target"`
	Time     time.Time `json:"time"`
	// Taint is the taint remediate added, if any (removed on uncordon).
	Taint *corev1.Taint `json:"taint,omitempty"`
}

// CordonedBy returns remediate's cordon record on n, if any.
func CordonedBy(n *corev1.Node) (CordonRecord, bool) {
	v, ok := n.Annotations[AnnotationCordonedBy]
	if !ok {
		return CordonRecord{}, false
	}
	var r CordonRecord
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		// Ours but unreadable: still ours; uncordon keeps working.
		return CordonRecord{Detector: "unknown"}, true
	}
	return r, true
}

// ErrCordonedByOther is returned by Cordon when the node is already
// unschedulable and remediate did not do it: it is not remediate's to
// manage, so nothing is changed.
var ErrCordonedByOther = fmt.Errorf("node is already cordoned by someone else")

// Cordon marks node unschedulable (and adds taint, if non-nil), recording
// rec in AnnotationCordonedBy, with an optimistic-concurrency update
// (retried once on conflict). It returns the previous unschedulable value.
func Cordon(ctx context.Context, cs kubernetes.Interface, name string, rec CordonRecord) (prevUnschedulable bool, err error) {
	for attempt := 0; ; attempt++ {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("reading node %s: %w", name, err)
		}
		if _, ours := CordonedBy(n); ours {
			return true, nil // already done (e.g. retry after a restart)
		}
		if n.Spec.Unschedulable {
			return true, ErrCordonedByOther
		}
		n.Spec.Unschedulable = true
		if rec.Taint != nil && !hasTaint(n.Spec.Taints, rec.Taint) {
			n.Spec.Taints = append(n.Spec.Taints, *rec.Taint)
		} else {
			rec.Taint = nil // present already: not ours to remove later
		}
		js, _ := json.Marshal(rec)
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		n.Annotations[AnnotationCordonedBy] = string(js)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && attempt == 0 {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("cordoning node %s: %w", name, err)
		}
		return false, nil
	}
}

// Uncordon undoes remediate's cordon on node: unschedulable back to false,
// remediate's taint and annotation removed. A node without the annotation
// is left alone (changed false).
func Uncordon(ctx context.Context, cs kubernetes.Interface, name string) (changed bool, err error) {
	for attempt := 0; ; attempt++ {
		n, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, fmt.Errorf("reading node %s: %w", name, err)
		}
		rec, ours := CordonedBy(n)
		if !ours {
			return false, nil
		}
		n.Spec.Unschedulable = false
		if rec.Taint != nil {
			kept := n.Spec.Taints[:0]
			for _, t := range n.Spec.Taints {
				if !(t.Key == rec.Taint.Key && t.Effect == rec.Taint.Effect) {
					kept = append(kept, t)
				}
			}
			n.Spec.Taints = kept
		}
		delete(n.Annotations, AnnotationCordonedBy)
		_, err = cs.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) && attempt == 0 {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("uncordoning node %s: %w", name, err)
		}
		return true, nil
	}
}

func hasTaint(ts []corev1.Taint, t *corev1.Taint) bool {
	for _, x := range ts {
		if x.Key == t.Key && x.Effect == t.Effect {
			return true
		}
	}
	return false
}
