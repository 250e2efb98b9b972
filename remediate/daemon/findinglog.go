package daemon

import (
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// findingLog logs a finding when it appears, changes severity or
// resolves, not every cycle, at a level matching its severity (critical:
// error, warning: warn, info: info). A rule skipped in a cycle keeps its
// findings as they were: unknown is not resolved.
type findingLog struct {
	last map[string]remediate.ReportFinding // guardrails.TargetKey → last seen
}

func levelOf(s finding.Severity) zapcore.Level {
	switch s {
	case finding.Critical:
		return zapcore.ErrorLevel
	case finding.Warning:
		return zapcore.WarnLevel
	}
	return zapcore.InfoLevel
}

func (l *findingLog) observe(log *zap.Logger, rep *remediate.Report) {
	if l.last == nil {
		l.last = map[string]remediate.ReportFinding{}
	}
	skipped := map[string]bool{}
	for _, s := range rep.Skipped {
		skipped[s.Rule] = true
	}
	now := map[string]remediate.ReportFinding{}
	for _, f := range rep.Findings {
		k := guardrails.TargetKey(f.Rule, f.Target)
		now[k] = f
		fields := []zap.Field{zap.String("rule", f.Rule), zap.String("detector", f.Detector), zap.String("target", f.Target),
			zap.String("severity", string(f.Severity)), zap.String("message", f.Message)}
		prev, seen := l.last[k]
		switch {
		case !seen:
			log.Log(levelOf(f.Severity), "finding appeared", fields...)
		case prev.Severity != f.Severity:
			log.Log(levelOf(f.Severity), "finding changed severity", append(fields, zap.String("was", string(prev.Severity)))...)
		}
	}
	for k, f := range l.last {
		if _, still := now[k]; still {
			continue
		}
		if skipped[f.Rule] {
			now[k] = f // not looked at this cycle
			continue
		}
		log.Info("finding resolved", zap.String("rule", f.Rule), zap.String("detector", f.Detector), zap.String("target", f.Target),
			zap.String("severity", string(f.Severity)))
	}
	l.last = now
}
