package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"

	"github.com/remediate-dev/remediate/internal/memlimit"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/daemon"
	"github.com/remediate-dev/remediate/remediate/exporters/prometheusexporter"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// runMain is the root command: the daemon, or one pass with --once. It
// returns the exit status.
func runMain(ctx context.Context, o *options, stdout, stderr io.Writer) int {
	if o.nodeName == "" {
		o.nodeName = nodeNameDefault()
	}
	// A one-shot run logs for a person at a terminal: text, and the
	// start-up facts (memory limit, sandbox) at debug, its report saying
	// what matters; the daemon's log keeps them at info.
	o.startupLevel = zapcore.InfoLevel
	if o.once {
		o.startupLevel = zapcore.DebugLevel
	}
	if o.logFormat == "" {
		o.logFormat = "json"
		if o.once {
			o.logFormat = "console"
		}
	}
	log, err := newLogger(o.logFormat, o.logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitError
	}
	defer func() { _ = log.Sync() }()
	// client-go's retries and reflector errors are the daemon's business at
	// debug level; what an operator needs is said once (wire_kube.go).
	klog.SetLogger(zapr.NewLogger(demote(log.Named("klog"), zapcore.DebugLevel)))
	// Without GOMEMLIMIT the Go heap gets a soft limit at 80% of the
	// container's cgroup memory limit; without GOGC, GOGC=25 (memlimit.GCPercent).
	if ml := memlimit.Set(""); ml.Limit > 0 {
		log.Log(o.startupLevel, "Go memory limit from the cgroup", zap.Int64("limitBytes", ml.Limit), zap.Int64("cgroupLimitBytes", ml.CgroupLimit), zap.Int("gogc", ml.GCPercent))
	} else {
		log.Debug("no Go memory limit from the cgroup", zap.String("reason", ml.Reason), zap.Int("gogc", ml.GCPercent))
	}

	if err := checkPaths(o); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "Error: %s\n", line)
		}
		return exitError
	}
	pol, err := policy.Load(o.policy, remediate.Catalog{})
	if err != nil {
		fmt.Fprintf(stderr, "Error: invalid policy %s:\n%v\n", o.policy, err)
		return exitError
	}
	var capped []string
	if o.once && o.sample > 0 {
		capped = capForSamples(pol, 2)
	}
	cleanup, err := prepareStateDir(o)
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitError
	}
	defer cleanup()
	if !o.once {
		// One daemon per state dir, for its whole life; --once takes turns
		// with it per cycle (state.lock) as before.
		release, err := (&remediate.Store{Dir: o.stateDir}).LockDaemon()
		if err != nil {
			fmt.Fprintf(stderr, "Error: --state-dir %s: %v\n", o.stateDir, err)
			return exitError
		}
		defer release()
	}
	// Before the first read of the node: from here on the daemon and its
	// children reach only the paths their flags name (sandbox.go).
	restrictSelf(o, log)
	j, err := journal.Open(o.stateDir, 0, 0)
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitError
	}
	w := newWiring(o, pol, log)
	defer w.Close()
	metrics := prometheusexporter.New(w.metricsSources(o.nodeName))
	eng, err := remediate.New(pol, remediate.Options{
		NodeFor: w.Node, StateDir: o.stateDir, ForceDryRun: o.dryRun, Once: o.once,
		Cluster: w.Guardrails(), Journal: j, Exporters: []remediate.Exporter{metrics}, Log: log,
	})
	if err != nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitError
	}
	if o.once {
		return runOnce(ctx, eng, o, capped, w, stdout, stderr, log)
	}

	if o.debugPprof != "" {
		stop, err := startDebugPprof(o.debugPprof, log)
		if err != nil {
			fmt.Fprintf(stderr, "Error: %v\n", err)
			return exitError
		}
		defer stop()
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	reload := make(chan struct{}, 1)
	go func() {
		for range hup {
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}()
	d := daemon.New(daemon.Config{
		PolicyPath: o.policy,
		Load:       func(p string) (*policy.Policy, error) { return policy.Load(p, remediate.Catalog{}) },
		Engine:     eng, Metrics: metrics.Handler(), Addr: o.metricsAddr, Reload: reload, Log: log,
		OnReport: w.OnReport, OnReloadError: w.OnReloadError,
	})
	if err := d.Run(ctx); err != nil {
		log.Error("daemon failed", zap.Error(err))
		return exitError
	}
	return exitOK
}

func runOnce(ctx context.Context, eng *remediate.Engine, o *options, capped []string, w *wiring, stdout, stderr io.Writer, log *zap.Logger) int {
	var sampled *remediate.SampleInfo
	if o.sample > 0 {
		var err error
		if sampled, err = takeFirstSample(ctx, eng, o.sample, stderr); err != nil {
			fmt.Fprintf(stderr, "Error: %v\n", err)
			return exitError
		}
		if sampled != nil {
			sampled.Capped = capped
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rep, err := eng.Cycle(cctx)
	if rep == nil {
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return exitError
	}
	rep.Sampled = sampled
	if o.stateWarning != "" {
		rep.Warnings = append(rep.Warnings, o.stateWarning)
	}
	if o.sandboxWarning != "" {
		rep.Warnings = append(rep.Warnings, o.sandboxWarning)
	}
	code := rep.ExitCode()
	if err != nil {
		// The report is complete, but the guardrail state is not saved.
		rep.Warnings = append(rep.Warnings, err.Error())
		code = exitError
	}
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	eng.Close(rctx)
	rcancel()
	if o.bundle != "" {
		// After the pass: the bundle's reads (saves, nft, conntrack) do
		// not compete with the detectors' deadlines.
		parts, berr := writeBundle(ctx, o, eng.Policy(), w, rep)
		if berr != nil {
			rep.Warnings = append(rep.Warnings, "no bundle written: "+berr.Error())
			code = exitError
		} else {
			fmt.Fprintf(stderr, "remediate: bundle %s written (%d parts; read it with: remediate bundle show %s)\n", o.bundle, parts, o.bundle)
		}
	}
	if o.output == "json" {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteText(stdout)
	}
	if err != nil {
		log.Error("writing report", zap.Error(err))
		return exitError
	}
	return code
}

// demote logs every entry of l at level to (entries below the logger's
// level are dropped as usual).
func demote(l *zap.Logger, to zapcore.Level) *zap.Logger {
	return l.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core { return demotedCore{c, to} }))
}

type demotedCore struct {
	zapcore.Core
	to zapcore.Level
}

func (c demotedCore) Enabled(zapcore.Level) bool { return c.Core.Enabled(c.to) }
func (c demotedCore) With(f []zapcore.Field) zapcore.Core {
	return demotedCore{c.Core.With(f), c.to}
}
func (c demotedCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Level < zapcore.DPanicLevel { // never turn a panic into a debug line
		e.Level = c.to
	}
	if !c.Core.Enabled(e.Level) {
		return ce
	}
	return ce.AddCore(e, c)
}
func (c demotedCore) Write(e zapcore.Entry, f []zapcore.Field) error {
	if e.Level < zapcore.DPanicLevel {
		e.Level = c.to
	}
	return c.Core.Write(e, f)
}

func newLogger(format, level string, w io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.Set(level); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	var enc zapcore.Encoder
	switch format {
	case "json":
		cfg := zap.NewProductionEncoderConfig()
		cfg.EncodeTime = zapcore.ISO8601TimeEncoder
		enc = zapcore.NewJSONEncoder(cfg)
	case "console":
		cfg := zap.NewDevelopmentEncoderConfig()
		cfg.EncodeTime = zapcore.TimeEncoderOfLayout("15:04:05")
		enc = zapcore.NewConsoleEncoder(cfg)
	default:
		return nil, fmt.Errorf("--log-format must be json or console, got %q", format)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.AddSync(w), lvl)), nil
}

func jsonLine(r journal.Record) (string, error) {
	b, err := json.Marshal(r)
	return string(b), err
}
