package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/termsafe"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// Exit codes of --once and the subcommands.
const (
	exitOK       = 0
	exitError    = 1
	exitFindings = 2
)

// options are the root command's flags.
type options struct {
	policy       string
	stateDir     string
	nodeName     string
	kubeconfig   string
	procRoot     string
	hostRoot     string
	sysRoot      string
	cniConfDir   string
	cniBinDir    string
	cniIPAMDir   string
	podLogDir    string
	criSocket    string
	cgroupRoot   string
	xtablesLock  string
	metricsAddr  string
	logFormat    string
	logLevel     string
	once         bool
	dryRun       bool
	output       string
	sample       time.Duration
	bundle       string
	bundleMaxMiB int
	// viewMemory is --cluster-view-memory (a quantity), viewMaxAge
	// --cluster-view-max-age.
	viewMemory string
	viewMaxAge time.Duration
	// kubeletURL, kubeletCA and kubeletInsecureTLS: the kubelet's /metrics
	// (wire_kubelet.go).
	kubeletURL         string
	kubeletCA          string
	kubeletInsecureTLS bool
	// debugPprof is --debug-pprof: a loopback address for Go's profiles
	// (pprof.go); empty: none.
	debugPprof string

	// journalDir is the state dir as given (the bundle reads the journal's
	// tail there even when a dry run works on a private copy).
	journalDir string
	// stateWarning is said in the --once report (a dry run on a state dir
	// it cannot write).
	stateWarning string
	// noLandlock is --no-landlock; sandboxWarning is said in the --once
	// report when the daemon's file access is not confined (sandbox.go).
	noLandlock     bool
	sandboxWarning string
	// startupLevel is the level of the start-up facts (runMain: debug
	// in a one-shot run, info in the daemon).
	startupLevel zapcore.Level
}

// usageError is a command-line mistake: it is printed with a pointer to
// the command's --help.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// exitStatus is a command's result beyond success: the code, and nothing
// more to print (the command already said what it had to).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// Run is the whole command; main only adds signal handling and os.Exit.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	return exitCode(cmd, err, stderr)
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	o := &options{}
	root := &cobra.Command{
		Use:   "remediate [flags]",
		Short: "Keep a Kubernetes node's service data plane healthy",
		Long: `remediate watches what kube-proxy and the kernel do on this node (sync health,
iptables and IPVS rules, conntrack, hung iptables-restore, the xtables lock),
reports what is wrong and, only when its policy says so and within guardrails,
fixes it.

Without a subcommand it runs the daemon; with --once it runs one pass and exits
0 (no findings), 2 (findings) or 1 (error).`,
		Example: `  remediate --once --dry-run --policy examples/audit.yaml --state-dir /tmp/remediate
  remediate --once -o json --policy /etc/remediate/policy.yaml
  remediate policy check examples/*.yaml
  remediate journal --state-dir /var/lib/remediate`,
		Version:       version,
		Args:          noArgs,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.output != "text" && o.output != "json" {
				return usageErrorf("--output must be text or json, got %q", o.output)
			}
			if o.logFormat != "" && o.logFormat != "json" && o.logFormat != "console" {
				return usageErrorf("--log-format must be json or console, got %q", o.logFormat)
			}
			if err := checkSample(o); err != nil {
				return err
			}
			if _, err := viewBudget(o.viewMemory); err != nil {
				return err
			}
			if o.viewMaxAge < 0 {
				return usageErrorf("--cluster-view-max-age must not be negative, got %s", o.viewMaxAge)
			}
			if cmd.Flags().Changed("sample") && !o.once {
				return usageErrorf("--sample needs --once")
			}
			var lvl zapcore.Level
			if err := lvl.Set(o.logLevel); err != nil {
				return usageErrorf("--log-level must be debug, info, warn or error, got %q", o.logLevel)
			}
			return codeErr(runMain(cmd.Context(), o, stdout, stderr))
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate("remediate {{.Version}}\n")
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	addRootFlags(root, o)
	root.AddCommand(newPolicyCmd(stdout, stderr), newJournalCmd(stdout, stderr), newBundleCmd(stdout, stderr), newCleanupCmd(stdout, stderr), newVersionCmd(stdout))
	// The completion command is cobra's; made strict like the others (an
	// unknown shell is a usage error, not help and exit 0).
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args = noArgs
			c.RunE = func(cmd *cobra.Command, _ []string) error {
				return usageErrorf("%q needs a shell: bash, zsh, fish or powershell", cmd.CommandPath())
			}
		}
	}
	return root
}

func addRootFlags(root *cobra.Command, o *options) {
	fs := root.Flags()
	fs.SortFlags = false
	fs.StringVar(&o.policy, "policy", "/etc/remediate/policy.yaml", "policy file (RemediationPolicy YAML); reloaded on SIGHUP and when it changes")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/remediate", "directory for guardrail state and the journal (persist it across restarts)")
	fs.StringVar(&o.nodeName, "node-name", "", "this node's name (default $NODE_NAME, else the hostname)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: in-cluster config; without either, API-dependent checks are skipped)")
	fs.StringVar(&o.procRoot, "proc-root", "/proc", "procfs root; every /proc and /proc/sys read goes through it")
	fs.StringVar(&o.hostRoot, "host-root", "", "the host's root filesystem, read-only (the host's iptables install); empty: <proc-root>/1/root, which needs ptrace access to PID 1")
	fs.StringVar(&o.sysRoot, "sys-root", "/sys", "sysfs root (conntrack hashsize: <sys-root>/module/nf_conntrack/parameters/hashsize)")
	fs.StringVar(&o.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "the host's CNI configuration directory as mounted here (read-only; CNIConfig)")
	fs.StringVar(&o.cniBinDir, "cni-bin-dir", "/opt/cni/bin", "the host's CNI plugin directory as mounted here (read-only; CNIConfig)")
	fs.StringVar(&o.cniIPAMDir, "cni-ipam-dir", "/var/lib/cni/networks", "host-local IPAM's data directory as mounted here (read-only; HostLocalIPAM)")
	fs.StringVar(&o.podLogDir, "pod-log-dir", "/var/log/pods", "the kubelet's pod log directory as mounted here (read-only; the tail of kube-proxy's and the CNI agents' logs: the causes they name, XtablesLockMessages; empty: not read)")
	fs.StringVar(&o.criSocket, "cri-socket", "", "the container runtime's CRI socket as mounted here (ListPodSandbox only: HostLocalIPAM's leak check; empty: skipped)")
	fs.StringVar(&o.kubeletURL, "kubelet-metrics-url", "", "this node's kubelet /metrics (KubeletPodStartup; empty: https://<the Node's InternalIP>:<its kubelet port>/metrics), read with the ServiceAccount's token (RBAC get nodes/metrics)")
	fs.StringVar(&o.kubeletCA, "kubelet-ca", "", "CA file that signs the kubelet's serving certificate (empty: the cluster's CA, which signs it only with the kubelet's serverTLSBootstrap)")
	fs.BoolVar(&o.kubeletInsecureTLS, "kubelet-insecure-tls", false, "do not verify the kubelet's serving certificate (self-signed, the kubeadm default); only ever used to an address of this host, and the token is sent only on a connection accepted by a root-owned socket (the kubelet's), so it stays on the node and never reaches a process that took the kubelet's port; a kubeconfig's insecure-skip-tls-verify is never used for the kubelet")
	fs.StringVar(&o.cgroupRoot, "cgroup-root", "/sys/fs/cgroup", "cgroup filesystem root (kube-proxy's cpu.stat, v1 or v2, for the likely causes of its symptoms)")
	fs.StringVar(&o.xtablesLock, "xtables-lock", "/run/xtables.lock", "the xtables lock file (it may not exist yet; its directory must)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", ":9808", "address for /metrics, /healthz and /readyz (daemon only; empty disables)")
	fs.StringVar(&o.debugPprof, "debug-pprof", "", "loopback address (such as 127.0.0.1:6060) for Go's profiles, /debug/pprof/ (daemon only; for measuring it; empty disables)")
	fs.BoolVar(&o.noLandlock, "no-landlock", false, "do not confine the daemon's own file access with Landlock to the paths above (by default it is, when the kernel has Landlock and the daemon runs without CAP_SYS_PTRACE; deploy/README.md)")
	fs.StringVar(&o.logFormat, "log-format", "", "json or console (default json for the daemon, console for --once)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.once, "once", false, "run one detection pass plus decisions and exit (0: no findings, 2: findings, 1: error)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "force audit mode for this run: report what would be done, change nothing")
	fs.StringVarP(&o.output, "output", "o", "text", "--once output: text or json")
	fs.DurationVar(&o.sample, "sample", defaultSample, "--once: sample rate and window checks twice this far apart so they judge in one run (0: one snapshot; else at least 5s)")
	fs.StringVar(&o.bundle, "bundle", "", "--once: also write the evidence (report, *-save, nft, IPVS, conntrack, kube-proxy endpoints, locks, processes, journal tail) to this .tar.gz")
	fs.StringVar(&o.viewMemory, "cluster-view-memory", defaultViewMemory, "memory budget of the cluster view (Services, EndpointSlices and what the checks build from them; a quantity such as 64Mi, 0 for none): past it, the checks and actions that compare the node with the cluster are off and say so")
	fs.DurationVar(&o.viewMaxAge, "cluster-view-max-age", kube.DefaultMaxViewAge, "how long the checks that compare the node with the cluster keep using the cluster view while the API server does not answer (they say its age); older, they skip (0: at once)")
	fs.IntVar(&o.bundleMaxMiB, "bundle-max-mib", 20, "--bundle: the most the bundle's parts may hold together, MiB (each part is also capped; cut parts are marked)")
	_ = root.MarkFlagFilename("policy", "yaml", "yml")
	_ = root.MarkFlagDirname("state-dir")
	_ = root.MarkFlagFilename("kubeconfig")
	_ = root.MarkFlagDirname("proc-root")
	_ = root.MarkFlagDirname("sys-root")
	_ = root.MarkFlagDirname("cni-conf-dir")
	_ = root.MarkFlagDirname("cni-bin-dir")
	_ = root.MarkFlagDirname("cni-ipam-dir")
	_ = root.MarkFlagDirname("pod-log-dir")
	_ = root.MarkFlagDirname("cgroup-root")
	_ = root.MarkFlagFilename("xtables-lock")
	fixed := func(vals ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return vals, cobra.ShellCompDirectiveNoFileComp
		}
	}
	_ = root.RegisterFlagCompletionFunc("output", fixed("text", "json"))
	_ = root.RegisterFlagCompletionFunc("log-format", fixed("json", "console"))
	_ = root.RegisterFlagCompletionFunc("log-level", fixed("debug", "info", "warn", "error"))
}

// nodeNameDefault is --node-name's default: $NODE_NAME, else the hostname.
func nodeNameDefault() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	h, _ := os.Hostname()
	return h
}

// noArgs rejects positional arguments, naming them and the subcommands.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	var subs []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() {
			subs = append(subs, c.Name())
		}
	}
	if len(subs) > 0 {
		// cobra's own "did you mean" is only for commands without Args.
		// (Not for shell names: tcsh is not a typo of bash.)
		if cmd.SuggestionsMinimumDistance <= 0 && cmd.Name() != "completion" {
			cmd.SuggestionsMinimumDistance = 2
		}
		if sugg := cmd.SuggestionsFor(args[0]); len(sugg) > 0 && cmd.Name() != "completion" {
			return usageErrorf("unknown command %q for %q: did you mean %q? (commands: %s)", args[0], cmd.CommandPath(), sugg[0], strings.Join(subs, ", "))
		}
		return usageErrorf("unknown command %q for %q (commands: %s)", args[0], cmd.CommandPath(), strings.Join(subs, ", "))
	}
	return usageErrorf("unexpected argument %q for %q", args[0], cmd.CommandPath())
}

func codeErr(code int) error {
	if code == exitOK {
		return nil
	}
	return exitStatus(code)
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  noArgs,
		Run: func(*cobra.Command, []string) {
			fmt.Fprintf(stdout, "remediate %s\n", version)
		},
	}
}

func newPolicyCmd(stdout, stderr io.Writer) *cobra.Command {
	pc := &cobra.Command{
		Use:   "policy",
		Short: "Validate and explain policies",
		Long:  "Validate policy files, print the effective policy with its defaults, list detector and action types.",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageErrorf("%q needs a subcommand: check, show or types", cmd.CommandPath())
		},
	}
	check := &cobra.Command{
		Use:   "check FILE...",
		Short: "Validate policy files; exit 1 with every error",
		Long: `Validate policy files. Every error is printed as file:line:col: field: message,
all of them at once; the exit status is 1 if any file is invalid. A valid file
that uses a deprecated type name is ok, with a note in the same form.`,
		Example: "  remediate policy check examples/audit.yaml examples/enforce.yaml",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("%q needs at least one FILE", cmd.CommandPath())
			}
			return nil
		},
		ValidArgsFunction: yamlFiles,
		RunE: func(_ *cobra.Command, args []string) error {
			code := exitOK
			for _, f := range args {
				p, err := policy.Load(f, remediate.Catalog{})
				if err != nil {
					fmt.Fprintln(stderr, err)
					code = exitError
					continue
				}
				for _, n := range p.Notes { // accepted, but say it
					fmt.Fprintln(stderr, n)
				}
				fmt.Fprintf(stdout, "%s: ok\n", f)
			}
			return codeErr(code)
		},
	}
	show := &cobra.Command{
		Use:               "show FILE",
		Short:             "Print the effective policy, every default filled in",
		Example:           "  remediate policy show examples/audit.yaml",
		Args:              exactlyOne("FILE"),
		ValidArgsFunction: yamlFiles,
		RunE: func(_ *cobra.Command, args []string) error {
			p, err := policy.Load(args[0], remediate.Catalog{})
			if err != nil {
				fmt.Fprintln(stderr, err)
				return exitStatus(exitError)
			}
			out, err := policy.Marshal(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(stdout, "# effective policy of %s (defaults included)\n%s", args[0], out)
			return nil
		},
	}
	types := &cobra.Command{
		Use:   "types",
		Short: "List detector and action types with their parameters, meaning and default",
		Args:  noArgs,
		RunE: func(*cobra.Command, []string) error {
			return writeTypes(stdout)
		},
	}
	pc.AddCommand(check, show, types)
	return pc
}

func exactlyOne(what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) == 0:
			return usageErrorf("%q needs %s", cmd.CommandPath(), what)
		case len(args) > 1:
			return usageErrorf("%q takes one %s, got %d arguments", cmd.CommandPath(), what, len(args))
		}
		return nil
	}
}

func yamlFiles(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return []string{"yaml", "yml"}, cobra.ShellCompDirectiveFilterFileExt
}

func newJournalCmd(stdout, stderr io.Writer) *cobra.Command {
	var dir, out string
	jc := &cobra.Command{
		Use:     "journal",
		Short:   "Print the audit journal (intents, outcomes, dry-runs, escalations)",
		Example: "  remediate journal --state-dir /var/lib/remediate\n  remediate journal -o json | jq .",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out != "text" && out != "json" {
				return usageErrorf("--output must be text or json, got %q", out)
			}
			// A state dir that is not there is a wrong path, not an
			// empty journal ("the daemon did nothing" misleads).
			if err := readableDir(dir); err != nil {
				fmt.Fprintf(stderr, "remediate journal: --state-dir %s: %v (the daemon's default is /var/lib/remediate; --once runs use theirs)\n", dir, err)
				return exitStatus(exitError)
			}
			// Streamed: one record in memory at a time, whatever the
			// journal's size.
			n := 0
			err := journal.Walk(dir, func(r journal.Record) error {
				n++
				if out == "json" {
					// JSON leaves DEL, C1 and bidi controls raw:
					// escaped as \uXXXX, the same value decoded.
					b, _ := jsonLine(r)
					_, err := fmt.Fprintln(&termsafe.JSONWriter{W: stdout}, b)
					return err
				}
				// journal.Format neutralises the record's outside text.
				_, err := fmt.Fprintln(stdout, journal.Format(r))
				return err
			})
			if err != nil {
				fmt.Fprintf(stderr, "remediate journal: %v\n", err)
				if n == 0 {
					return exitStatus(exitError)
				}
			}
			if n == 0 {
				fmt.Fprintf(stdout, "journal in %s is empty\n", dir)
			}
			return nil
		},
	}
	jc.Flags().StringVar(&dir, "state-dir", "/var/lib/remediate", "state directory holding journal.jsonl")
	jc.Flags().StringVarP(&out, "output", "o", "text", "text or json (one record per line)")
	_ = jc.MarkFlagDirname("state-dir")
	_ = jc.RegisterFlagCompletionFunc("output", func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return []string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp
	})
	return jc
}

// defaultViewMemory is --cluster-view-memory's default
// (kube.DefaultMemoryBudget).
const defaultViewMemory = "64Mi"

// viewBudget parses --cluster-view-memory: bytes, < 0 for none.
func viewBudget(v string) (int64, error) {
	q, err := resource.ParseQuantity(v)
	if err != nil || q.Sign() < 0 {
		return 0, usageErrorf("--cluster-view-memory must be a quantity such as 64Mi (0: no budget), got %q", v)
	}
	if q.IsZero() {
		return -1, nil
	}
	return q.Value(), nil
}
