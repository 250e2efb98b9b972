package guardrails

import "context"

// MaxTargets caps the targets acted on (or that would be, in a dry run) in
// one cycle; Acted is the cycle's counter, which the engine advances.
type MaxTargets struct {
	Max   int
	Acted *int
}

// Name implements Guardrail.
func (g MaxTargets) Name() string { return GuardMaxTargets }

// Check implements Guardrail.
func (g MaxTargets) Check(_ context.Context, _ *Request) error {
	if *g.Acted >= g.Max {
		return Block(GuardMaxTargets, "already %d targets this cycle (max %d)", *g.Acted, g.Max)
	}
	return nil
}
