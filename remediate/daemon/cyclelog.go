package daemon

import (
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/remediate-dev/remediate/remediate"
)

// cycleLogEvery is how often an unchanged cycle is still said at info: a
// healthy node shows it is alive every 10 minutes instead of every cycle.
const cycleLogEvery = 10 * time.Minute

// cycleSummary is what one cycle did, counted: the info line's fields.
type cycleSummary struct {
	Rules, Run, OK, Skipped, Findings, Decisions int
	Executed, DryRun, Blocked, Failed            int
}

// summarize counts a cycle's report. Every rule is in exactly one of OK,
// Skipped or (one or more) Findings; Run is the rules whose detector ran.
func summarize(rep *remediate.Report) cycleSummary {
	s := cycleSummary{OK: len(rep.OK), Skipped: len(rep.Skipped), Findings: len(rep.Findings), Decisions: len(rep.Decisions)}
	withFindings := map[string]bool{}
	for _, f := range rep.Findings {
		withFindings[f.Rule] = true
	}
	s.Run = s.OK + len(withFindings)
	s.Rules = s.Run + s.Skipped
	for _, d := range rep.Decisions {
		switch d.Outcome {
		case remediate.OutcomeExecuted:
			s.Executed++
		case remediate.OutcomeDryRun:
			s.DryRun++
		case remediate.OutcomeBlocked:
			s.Blocked++
		case remediate.OutcomeFailed:
			s.Failed++
		}
	}
	return s
}

// cycleLog rate-limits the per-cycle line: info when the summary differs
// from the last one said at info, or cycleLogEvery after it; debug
// otherwise.
type cycleLog struct {
	last   cycleSummary
	lastAt time.Time
	said   bool
}

// level decides the line's level for summary s at now (and remembers it
// when it is info).
func (l *cycleLog) level(s cycleSummary, now time.Time) zapcore.Level {
	if l.said && s == l.last && now.Sub(l.lastAt) < cycleLogEvery {
		return zapcore.DebugLevel
	}
	l.last, l.lastAt, l.said = s, now, true
	return zapcore.InfoLevel
}

// observe says one cycle.
func (l *cycleLog) observe(log *zap.Logger, rep *remediate.Report, took time.Duration, now time.Time) {
	s := summarize(rep)
	lvl := l.level(s, now)
	if !log.Core().Enabled(lvl) {
		return
	}
	log.Log(lvl, "cycle done", zap.Int("rules", s.Rules), zap.Int("run", s.Run), zap.Int("ok", s.OK), zap.Int("skipped", s.Skipped),
		zap.Int("findings", s.Findings), zap.Int("decisions", s.Decisions), zap.Int("executed", s.Executed),
		zap.Int("dryRun", s.DryRun), zap.Int("blocked", s.Blocked), zap.Int("failed", s.Failed),
		zap.Duration("took", took.Round(time.Millisecond)))
}
