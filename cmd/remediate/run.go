package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/zapr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"k8s.io/klog/v2"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/action"
	"github.com/remediate-dev/remediate/remediate/daemon"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// Exit codes of --once and the subcommands.
const (
	exitOK       = 0
	exitError    = 1
	exitFindings = 2
)

// options are the command-line flags.
type options struct {
	policy      string
	stateDir    string
	nodeName    string
	kubeconfig  string
	procRoot    string
	sysRoot     string
	xtablesLock string
	metricsAddr string
	logFormat   string
	logLevel    string
	once        bool
	dryRun      bool
	output      string
}

func newFlags(o *options, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet("remediate", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	host, _ := os.Hostname()
	if n := os.Getenv("NODE_NAME"); n != "" {
		host = n
	}
	fs.StringVar(&o.policy, "policy", "/etc/remediate/policy.yaml", "policy file (RemediationPolicy YAML)")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/remediate", "directory for guardrail state and the journal (persist it across restarts)")
	fs.StringVar(&o.nodeName, "node-name", host, "this node's name (default: $NODE_NAME, else the hostname)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config; without either, API-dependent checks are skipped)")
	fs.StringVar(&o.procRoot, "proc-root", "/proc", "procfs root; every /proc and /proc/sys read goes through it")
	fs.StringVar(&o.sysRoot, "sys-root", "/sys", "sysfs root (conntrack hashsize: <sys-root>/module/nf_conntrack/parameters/hashsize)")
	fs.StringVar(&o.xtablesLock, "xtables-lock", "/run/xtables.lock", "the xtables lock file")
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":9808", "address for /metrics, /healthz and /readyz (daemon only; empty disables)")
	fs.StringVar(&o.logFormat, "log-format", "", "json or console (default: json for the daemon, console for --once)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.once, "once", false, "run one detection pass plus decisions and exit (0: no findings, 2: findings, 1: error)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "force audit mode for this run: report what would be done, change nothing")
	fs.StringVarP(&o.output, "output", "o", "text", "--once output: text or json")
	return fs
}

// Run is the whole command; main only adds signal handling and os.Exit.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "version":
			fmt.Fprintf(stdout, "remediate %s\n", version)
			return exitOK
		case "policy":
			return runPolicy(args[1:], stdout, stderr)
		case "journal":
			return runJournal(args[1:], stdout, stderr)
		case "cleanup":
			return runCleanup(ctx, args[1:], stdout, stderr)
		}
	}
	var o options
	fs := newFlags(&o, stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		return exitError
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "remediate: unexpected argument %q (subcommands: policy, journal, version)\n", fs.Arg(0))
		return exitError
	}
	if o.output != "text" && o.output != "json" {
		fmt.Fprintf(stderr, "remediate: --output must be text or json\n")
		return exitError
	}
	if o.logFormat == "" {
		o.logFormat = "json"
		if o.once {
			o.logFormat = "console"
		}
	}
	log, err := newLogger(o.logFormat, o.logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "remediate: %v\n", err)
		return exitError
	}
	defer func() { _ = log.Sync() }()
	klog.SetLogger(zapr.NewLogger(log.Named("klog")))

	pol, err := policy.Load(o.policy, remediate.Catalog{})
	if err != nil {
		fmt.Fprintf(stderr, "remediate: invalid policy:\n%v\n", err)
		return exitError
	}
	j, err := journal.Open(o.stateDir, 0, 0)
	if err != nil {
		fmt.Fprintf(stderr, "remediate: %v\n", err)
		return exitError
	}
	w := newWiring(&o, pol, log)
	defer w.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := remediate.NewMetrics(reg)
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "remediate_fleet_paused",
		Help: "1 while every daemon holds all actions (ConfigMap remediate-fleet, key pause)."}, w.fleetPaused))
	eng, err := remediate.New(pol, remediate.Options{
		NodeFor: w.Node, StateDir: o.stateDir, ForceDryRun: o.dryRun, Once: o.once,
		Cluster: w.Guardrails(), Journal: j, Metrics: metrics, Log: log,
	})
	if err != nil {
		fmt.Fprintf(stderr, "remediate: %v\n", err)
		return exitError
	}
	if o.once {
		return runOnce(ctx, eng, &o, stdout, stderr, log)
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
		Engine:     eng, Metrics: metrics, Gatherer: reg, Addr: o.metricsAddr, Reload: reload, Log: log,
		OnReport: w.OnReport, OnReloadError: w.OnReloadError,
	})
	if err := d.Run(ctx); err != nil {
		log.Error("daemon failed", zap.Error(err))
		return exitError
	}
	return exitOK
}

func runOnce(ctx context.Context, eng *remediate.Engine, o *options, stdout, stderr io.Writer, log *zap.Logger) int {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	rep, err := eng.Cycle(cctx)
	if rep == nil {
		fmt.Fprintf(stderr, "remediate: %v\n", err)
		return exitError
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

func runPolicy(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: remediate policy check FILE... | show FILE | types")
		return exitError
	}
	switch args[0] {
	case "check":
		if len(args) < 2 {
			fmt.Fprintln(stderr, "usage: remediate policy check FILE...")
			return exitError
		}
		code := exitOK
		for _, f := range args[1:] {
			if _, err := policy.Load(f, remediate.Catalog{}); err != nil {
				fmt.Fprintln(stderr, err)
				code = exitError
				continue
			}
			fmt.Fprintf(stdout, "%s: ok\n", f)
		}
		return code
	case "show":
		if len(args) != 2 {
			fmt.Fprintln(stderr, "usage: remediate policy show FILE")
			return exitError
		}
		p, err := policy.Load(args[1], remediate.Catalog{})
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitError
		}
		out, err := policy.Marshal(p)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitError
		}
		fmt.Fprintf(stdout, "# effective policy of %s (defaults included)\n%s", args[1], out)
		return exitOK
	case "types":
		fmt.Fprintln(stdout, "DETECTORS:")
		for _, t := range detect.Types() {
			fmt.Fprintf(stdout, "  %-32s %s\n", t.Name, t.Doc)
			fmt.Fprintf(stdout, "  %-32s   reports: %s\n", "", remediate.KindList(t.Targets))
		}
		fmt.Fprintln(stdout, "ACTIONS:")
		for _, t := range action.Types() {
			d := t.Doc
			if t.Disruptive {
				d += " [disruptive: needs a cluster budget slot]"
			}
			fmt.Fprintf(stdout, "  %-32s %s\n", t.Name, d)
			fmt.Fprintf(stdout, "  %-32s   acts on: %s\n", "", remediate.ActsOn(t))
		}
		fmt.Fprintln(stdout, "PAIRS (action <- detectors whose findings can feed it; `policy check` refuses other pairs):")
		for _, t := range action.Types() {
			fmt.Fprintf(stdout, "  %-32s <- %s\n", t.Name, strings.Join(remediate.Feeders(t), ", "))
		}
		return exitOK
	}
	fmt.Fprintf(stderr, "remediate policy: unknown subcommand %q (check, show, types)\n", args[0])
	return exitError
}

func runJournal(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("journal", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("state-dir", "/var/lib/remediate", "state directory holding journal.jsonl")
	out := fs.StringP("output", "o", "text", "text or json (one record per line)")
	if err := fs.Parse(args); err != nil {
		return exitError
	}
	recs, err := journal.ReadAll(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "remediate journal: %v\n", err)
		if len(recs) == 0 {
			return exitError
		}
	}
	if len(recs) == 0 {
		fmt.Fprintf(stdout, "journal in %s is empty\n", *dir)
		return exitOK
	}
	for _, r := range recs {
		if *out == "json" {
			b, _ := jsonLine(r)
			fmt.Fprintln(stdout, b)
		} else {
			fmt.Fprintln(stdout, journal.Format(r))
		}
	}
	return exitOK
}

func jsonLine(r journal.Record) (string, error) {
	b, err := json.Marshal(r)
	return string(b), err
}
