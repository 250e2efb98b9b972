package remediate

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func at(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }

func TestStep(t *testing.T) {
	tm := Timing{For: 60 * time.Second, VerifyAfter: 30 * time.Second, MaxAttempts: 2}
	cases := []struct {
		name      string
		st        TargetState
		present   bool
		now       time.Time
		timing    Timing
		wantPhase Phase
		wantAct   bool
		check     func(t *testing.T, st TargetState)
	}{
		{name: "ok stays ok", st: TargetState{}, present: false, now: at(0), timing: tm, wantPhase: PhaseOK},
		{name: "ok to pending", st: TargetState{}, present: true, now: at(0), timing: tm, wantPhase: PhasePending,
			check: func(t *testing.T, st TargetState) {
				if !st.Since.Equal(at(0)) {
					t.Errorf("since = %v", st.Since)
				}
			}},
		{name: "ok to firing with for=0", st: TargetState{}, present: true, now: at(0), timing: Timing{MaxAttempts: 1}, wantPhase: PhaseFiring, wantAct: true},
		{name: "once acts now but stays pending", st: TargetState{}, present: true, now: at(0), timing: Timing{For: time.Hour, Once: true}, wantPhase: PhasePending, wantAct: true},
		{name: "pending waits", st: TargetState{Phase: PhasePending, Since: at(0)}, present: true, now: at(59), timing: tm, wantPhase: PhasePending},
		{name: "pending fires at for", st: TargetState{Phase: PhasePending, Since: at(0)}, present: true, now: at(60), timing: tm, wantPhase: PhaseFiring, wantAct: true},
		{name: "pending is due in once mode but stays pending", st: TargetState{Phase: PhasePending, Since: at(0)}, present: true, now: at(1), timing: Timing{For: time.Hour, Once: true}, wantPhase: PhasePending, wantAct: true,
			check: func(t *testing.T, st TargetState) {
				if !st.Since.Equal(at(0)) {
					t.Errorf("since = %v", st.Since)
				}
			}},
		{name: "pending flaps away", st: TargetState{Phase: PhasePending, Since: at(0)}, present: false, now: at(30), timing: tm, wantPhase: PhaseOK},
		{name: "firing keeps asking", st: TargetState{Phase: PhaseFiring, Since: at(0)}, present: true, now: at(90), timing: tm, wantPhase: PhaseFiring, wantAct: true},
		{name: "firing target vanishes", st: TargetState{Phase: PhaseFiring, Since: at(0)}, present: false, now: at(90), timing: tm, wantPhase: PhaseOK},
		{name: "failed retries", st: TargetState{Phase: PhaseFailed, Attempts: 1}, present: true, now: at(90), timing: tm, wantPhase: PhaseFailed, wantAct: true},
		{name: "failed target vanishes", st: TargetState{Phase: PhaseFailed, Attempts: 1}, present: false, now: at(90), timing: tm, wantPhase: PhaseOK},
		{name: "verifying waits while present", st: TargetState{Phase: PhaseVerifying, VerifyAt: at(100)}, present: true, now: at(99), timing: tm, wantPhase: PhaseVerifying},
		{name: "verifying waits while absent", st: TargetState{Phase: PhaseVerifying, VerifyAt: at(100)}, present: false, now: at(99), timing: tm, wantPhase: PhaseVerifying},
		{name: "verified resolved", st: TargetState{Phase: PhaseVerifying, VerifyAt: at(100)}, present: false, now: at(100), timing: tm, wantPhase: PhaseResolved},
		{name: "verification failed retries", st: TargetState{Phase: PhaseVerifying, VerifyAt: at(100)}, present: true, now: at(100), timing: tm, wantPhase: PhaseFailed, wantAct: true,
			check: func(t *testing.T, st TargetState) {
				if st.Attempts != 1 || st.LastError == "" {
					t.Errorf("attempts=%d lastError=%q", st.Attempts, st.LastError)
				}
			}},
		{name: "verification failed escalates at max", st: TargetState{Phase: PhaseVerifying, VerifyAt: at(100), Attempts: 1}, present: true, now: at(100), timing: tm, wantPhase: PhaseEscalated},
		{name: "verification with maxAttempts 0 escalates", st: TargetState{Phase: PhaseVerifying, VerifyAt: at(100)}, present: true, now: at(100), timing: Timing{}, wantPhase: PhaseEscalated},
		{name: "escalated stays while present", st: TargetState{Phase: PhaseEscalated, Attempts: 2}, present: true, now: at(1000), timing: tm, wantPhase: PhaseEscalated},
		{name: "escalated clears when finding clears", st: TargetState{Phase: PhaseEscalated, Attempts: 2}, present: false, now: at(1000), timing: tm, wantPhase: PhaseOK},
		{name: "resolved then absent drops", st: TargetState{Phase: PhaseResolved}, present: false, now: at(200), timing: tm, wantPhase: PhaseOK},
		{name: "resolved then recurs starts new episode", st: TargetState{Phase: PhaseResolved, Attempts: 1}, present: true, now: at(200), timing: tm, wantPhase: PhasePending,
			check: func(t *testing.T, st TargetState) {
				if st.Attempts != 0 {
					t.Errorf("attempts carried into new episode: %d", st.Attempts)
				}
			}},
		{name: "unknown phase never acts", st: TargetState{Phase: "FromTheFuture"}, present: true, now: at(0), timing: tm, wantPhase: "FromTheFuture"},
		{name: "unknown phase absent drops", st: TargetState{Phase: "FromTheFuture"}, present: false, now: at(0), timing: tm, wantPhase: PhaseOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, act := Step(tc.st, tc.present, tc.now, tc.timing)
			if got.Phase != tc.wantPhase || act != tc.wantAct {
				t.Fatalf("Step = (%s, act=%v), want (%s, act=%v)", got.Phase, act, tc.wantPhase, tc.wantAct)
			}
			if tc.check != nil {
				tc.check(t, got)
			}
		})
	}
}

func TestRecord(t *testing.T) {
	tm := Timing{VerifyAfter: 30 * time.Second, MaxAttempts: 2}
	st := Record(TargetState{Phase: PhaseFiring}, ActOutcome{}, at(10), tm)
	if st.Phase != PhaseVerifying || !st.VerifyAt.Equal(at(40)) || !st.LastActed.Equal(at(10)) {
		t.Fatalf("success: %+v", st)
	}
	st = Record(TargetState{Phase: PhaseFiring}, ActOutcome{Err: errors.New("boom")}, at(10), tm)
	if st.Phase != PhaseFailed || st.Attempts != 1 || st.LastError != "boom" {
		t.Fatalf("first failure: %+v", st)
	}
	st = Record(st, ActOutcome{Err: errors.New("boom")}, at(20), tm)
	if st.Phase != PhaseEscalated || st.Attempts != 2 {
		t.Fatalf("second failure: %+v", st)
	}
}

// TestFlappingFindingNeverFires feeds a finding that comes and goes faster
// than `for`: the rule must never fire.
func TestFlappingFindingNeverFires(t *testing.T) {
	tm := Timing{For: 60 * time.Second, VerifyAfter: 30 * time.Second, MaxAttempts: 3}
	var st TargetState
	for i := 0; i < 100; i++ {
		var act bool
		st, act = Step(st, i%3 != 2, at(i*20), tm) // present 40s, absent 20s
		if act {
			t.Fatalf("fired at cycle %d in phase %s", i, st.Phase)
		}
	}
}

// TestEpisode walks a whole episode: pending, fire, act fails, retry,
// verify fails, escalate, stays escalated, clears.
func TestEpisode(t *testing.T) {
	tm := Timing{For: 20 * time.Second, VerifyAfter: 30 * time.Second, MaxAttempts: 2}
	var st TargetState
	steps := []struct {
		now     int
		present bool
		act     bool
		outcome error
		want    Phase
	}{
		{0, true, false, nil, PhasePending},
		{10, true, false, nil, PhasePending},
		{20, true, true, errors.New("exec failed"), PhaseFailed},
		{30, true, true, nil, PhaseVerifying},
		{50, true, false, nil, PhaseVerifying},
		{60, true, false, nil, PhaseEscalated}, // verify failed: attempts 2 = max
		{500, true, false, nil, PhaseEscalated},
		{510, false, false, nil, PhaseOK},
	}
	for i, s := range steps {
		var act bool
		st, act = Step(st, s.present, at(s.now), tm)
		if act != s.act {
			t.Fatalf("step %d: act=%v want %v (phase %s)", i, act, s.act, st.Phase)
		}
		if act {
			st = Record(st, ActOutcome{Err: s.outcome}, at(s.now), tm)
		}
		if st.Phase != s.want {
			t.Fatalf("step %d: phase %s, want %s", i, st.Phase, s.want)
		}
	}
}
