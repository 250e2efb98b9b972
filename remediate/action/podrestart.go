package action

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/remediate-dev/remediate/policy"
)

// What RestartNodeAgent (and RestartKubeProxy's parameters, its old name)
// use: the bounds of the wait for a DaemonSet's replacement pod, and the
// wait itself.

// validateReadyWait checks readyTimeout and pollInterval.
func validateReadyWait(ready, poll policy.Duration) []policy.FieldError {
	var errs []policy.FieldError
	if ready.Duration < 10*time.Second || ready.Duration > 10*time.Minute {
		errs = append(errs, policy.FieldError{Field: "readyTimeout", Msg: "must be between 10s and 10m"})
	}
	if poll.Duration < 100*time.Millisecond || poll.Duration > ready.Duration {
		errs = append(errs, policy.FieldError{Field: "pollInterval", Msg: "must be between 100ms and readyTimeout"})
	}
	return errs
}

// waitReplacement polls list on every tick until a pod other than the
// deleted one (uid), not terminating, is Ready, and returns it; when ctx
// ends first it returns nil and what it saw last.
func waitReplacement(ctx context.Context, tick <-chan time.Time, list func(context.Context) ([]corev1.Pod, error), uid types.UID) (*corev1.Pod, string) {
	last := "no replacement pod yet"
	for {
		pods, err := list(ctx)
		if err != nil {
			last = err.Error()
		}
		for i := range pods {
			p := &pods[i]
			if p.UID == uid || p.DeletionTimestamp != nil {
				continue
			}
			if podReady(p) {
				return p, ""
			}
			last = fmt.Sprintf("replacement %s is %s, not Ready", p.Name, p.Status.Phase)
		}
		select {
		case <-ctx.Done():
			return nil, last
		case <-tick:
		}
	}
}

// podReady says the pod is Running with its Ready condition True.
func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
