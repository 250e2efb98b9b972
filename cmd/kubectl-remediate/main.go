// Command kubectl-remediate is a kubectl plugin (`kubectl remediate NODE`)
// for nodes without SSH: it finds the remediate DaemonSet pod on the named
// node, runs `remediate --once` in it through the API server's pod exec
// subresource (the daemon's own flags: its policy, its state dir, so rate
// limits and cooldowns are shared) and, with --bundle, copies the evidence
// bundle back and checks it.
//
//	kubectl remediate node1                       # report, forced dry-run
//	kubectl remediate node1 --bundle node1.tar.gz # plus the evidence bundle
//	kubectl remediate node1 -o json --sample 30s
//
// The exit status is remediate's: 0 no findings, 2 findings, 1 error.
//
// Two subcommands look at the fleet (docs/FLEET.md):
//
//	kubectl remediate fleet [--sort-by status] [-o json]  # every node from what the daemons write, no exec
//	kubectl remediate once --all-nodes [--parallel 4]     # --once on many nodes, one merged report, worst exit
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/remediate-dev/remediate/internal/bundle"
	"github.com/remediate-dev/remediate/internal/termsafe"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// Defaults matching deploy/ (the kustomize base and the Helm chart).
const (
	defaultNamespace = "remediate"
	defaultSelector  = "app.kubernetes.io/name=remediate"
	defaultContainer = "remediate"
	// entrypoint is the image's ENTRYPOINT (deploy/Dockerfile), used when
	// the container sets no command.
	entrypoint = "/usr/local/bin/remediate"
	// remoteDir is writable in the pod (an emptyDir on /tmp; the root
	// filesystem is read-only).
	remoteDir = "/tmp"
	// maxBundleCopy bounds the bytes copied back (remediate's
	// --bundle-max-mib allows at most 1024 MiB).
	maxBundleCopy = 1<<30 + 1<<20
)

// oneShotFlags are the daemon's flags the one-shot run does not take over
// from the pod's container: it sets them itself (--once, --node-name,
// --dry-run unless --act, -o, --sample, --bundle), or they only shape the
// daemon (--metrics-addr serves its /metrics; --log-format json is for a
// log collector, the one-shot run logs for a person). Every other argument
// of the container is carried as it is, so a new daemon flag (where a
// mount is, a budget) reaches the one-shot run without a change here
// (TestDaemonFlagsCoverTheChart). The value says whether the flag takes a
// value, so that "--flag value" drops both.
var oneShotFlags = map[string]bool{
	"--once": false, "--node-name": true, "--dry-run": false, "--output": true, "-o": true,
	"--sample": true, "--bundle": true, "--metrics-addr": true, "--log-format": true,
}

// daemonArgs are the container's arguments (its command's after the
// binary, then args) the one-shot run takes over, in their order: all but
// oneShotFlags, "--flag value" written "--flag=value", $(VAR) references
// expanded as the kubelet does (expandEnv).
func daemonArgs(pod *corev1.Pod, ctr *corev1.Container) []string {
	all := append(append([]string(nil), ctr.Command[min(1, len(ctr.Command)):]...), ctr.Args...)
	env := containerEnv(pod, ctr)
	var out []string
	for i := 0; i < len(all); i++ {
		a := expandEnv(all[i], env)
		name, _, hasValue := strings.Cut(a, "=")
		separate := !hasValue && strings.HasPrefix(a, "-") && i+1 < len(all) && !strings.HasPrefix(all[i+1], "-")
		if takesValue, own := oneShotFlags[name]; own {
			if takesValue && !hasValue && i+1 < len(all) {
				i++
			}
			continue
		}
		if separate {
			i++
			a += "=" + expandEnv(all[i], env)
		}
		out = append(out, a)
	}
	return out
}

// containerEnv are the container's environment variables whose value is
// known from the pod's spec: literal values (expanded against the ones
// before, as the kubelet does) and the downward API fields the kubelet
// resolves from the pod object itself.
func containerEnv(pod *corev1.Pod, ctr *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expandEnv(e.Value, env)
		case e.ValueFrom.FieldRef != nil:
			v, ok := map[string]string{
				"spec.nodeName":           pod.Spec.NodeName,
				"spec.serviceAccountName": pod.Spec.ServiceAccountName,
				"metadata.name":           pod.Name,
				"metadata.namespace":      pod.Namespace,
				"metadata.uid":            string(pod.UID),
				"status.podIP":            pod.Status.PodIP,
				"status.hostIP":           pod.Status.HostIP,
			}[e.ValueFrom.FieldRef.FieldPath]
			if ok {
				env[e.Name] = v
			}
		}
	}
	return env
}

// expandEnv expands $(VAR) references in s as the kubelet expands a
// container's arguments: a known variable by its value, an unknown one
// left as written, $$ as a literal $.
func expandEnv(s string, env map[string]string) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
			continue
		case '(':
			if j := strings.IndexByte(s[i+2:], ')'); j >= 0 {
				name := s[i+2 : i+2+j]
				if v, ok := env[name]; ok {
					b.WriteString(v)
				} else {
					b.WriteString(s[i : i+3+j])
				}
				i += 2 + j
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// Executor runs a command in a pod's container and streams its output;
// a command that exits non-zero returns a utilexec.ExitError.
type Executor interface {
	Exec(ctx context.Context, pod *corev1.Pod, container string, cmd []string, stdout, stderr io.Writer) error
}

// deps are what the tests replace: the API server's config and the
// executor (a kubelet is needed for a real exec).
type deps struct {
	restConfig  func(kubeconfig, context string) (*rest.Config, error)
	newExecutor func(*rest.Config, kubernetes.Interface) Executor
}

var realDeps = deps{
	restConfig: func(kubeconfig, kctx string) (*rest.Config, error) {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = kubeconfig
		return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kctx}).ClientConfig()
	},
	newExecutor: func(cfg *rest.Config, c kubernetes.Interface) Executor { return &apiExecutor{cfg: cfg, client: c} },
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr, realDeps))
}

type options struct {
	kubeconfig, context         string
	namespace, selector, ctr    string
	sample, output, bundleLocal string
	act                         bool
	timeout                     time.Duration
}

// exitStatus is remediate's exit status passed through.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer, d deps) int {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "kubectl-remediate NODE [flags] [-- REMEDIATE-FLAGS...]",
		Short: "Run remediate --once on a node through its DaemonSet pod",
		Long: `Finds the remediate pod on NODE (namespace and label selector of deploy/), runs
remediate --once in it with the daemon's own policy and state dir (so rate
limits and cooldowns are shared), forced dry-run unless --act, prints the
report and exits with its status (0 no findings, 2 findings, 1 error). With
--bundle FILE the evidence bundle is written in the pod's /tmp, copied here
with cat over the exec stream, removed there, and checked.
Flags after -- go to remediate unchanged.

Subcommands: fleet (every node in one look, no exec) and once (--once on
many nodes); a node named like one is reached with: kubectl remediate once NODE.`,
		Example: `  kubectl remediate node1
  kubectl remediate node1 --bundle node1.tar.gz
  kubectl remediate node1 -o json --sample 30s -- --log-level=debug`,
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			var extra []string
			if dash >= 0 {
				args, extra = args[:dash], args[dash:]
			}
			if len(args) != 1 {
				return fmt.Errorf("needs exactly one NODE, got %d arguments", len(args))
			}
			if o.output != "text" && o.output != "json" {
				return fmt.Errorf("--output must be text or json, got %q", o.output)
			}
			return remote(cmd.Context(), o, args[0], extra, stdout, stderr, d)
		},
	}
	// `kubectl remediate NODE` stays as it was; a node named like a
	// subcommand is reached with `kubectl remediate once NODE`.
	cmd.Args = cobra.ArbitraryArgs
	cmd.CompletionOptions.DisableDefaultCmd = true
	cmd.AddCommand(fleetCmd(stdout, d), onceCmd(stdout, stderr, d))
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context")
	fs.StringVarP(&o.namespace, "namespace", "n", defaultNamespace, "namespace of the remediate DaemonSet")
	fs.StringVarP(&o.selector, "selector", "l", defaultSelector, "label selector of the remediate pods")
	fs.StringVarP(&o.ctr, "container", "c", defaultContainer, "the remediate container")
	fs.StringVar(&o.sample, "sample", "", "remediate's --sample (default: remediate's, 10s)")
	fs.StringVarP(&o.output, "output", "o", "text", "report format: text or json")
	fs.StringVar(&o.bundleLocal, "bundle", "", "also copy the evidence bundle here (.tar.gz; not overwritten)")
	fs.BoolVar(&o.act, "act", false, "let the run act as the daemon's policy says (default: --dry-run)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on the whole run")
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	var st exitStatus
	switch {
	case err == nil:
		return 0
	case errors.As(err, &st):
		return int(st)
	default:
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return 1
	}
}

// remote does the work: find the pod, run --once, copy the bundle.
// execToTerminal runs cmd in the pod with its output passed on through
// termsafe: what a node's pod prints is outside text to this terminal (a
// compromised node could print escape sequences), text or JSON alike.
func execToTerminal(ctx context.Context, ex Executor, pod *corev1.Pod, container string, cmd []string, stdout, stderr io.Writer) error {
	so, se := &termsafe.Stream{W: stdout}, &termsafe.Stream{W: stderr}
	err := ex.Exec(ctx, pod, container, cmd, so, se)
	ferr := errors.Join(so.Flush(), se.Flush())
	if err != nil {
		return err // as the executor gave it: its exit status is read from it
	}
	return ferr
}

func remote(ctx context.Context, o *options, nodeName string, extra []string, stdout, stderr io.Writer, d deps) error {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	var f *os.File
	if o.bundleLocal != "" {
		// Created first: a file that exists is an error before anything runs.
		var err error
		if f, err = os.OpenFile(o.bundleLocal, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			return fmt.Errorf("--bundle: %w", err)
		}
		defer f.Close()
	}
	cfg, err := d.restConfig(o.kubeconfig, o.context)
	if err != nil {
		return abortBundle(f, fmt.Errorf("kubeconfig: %w", err))
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return abortBundle(f, err)
	}
	pod, err := findPod(ctx, client, o.namespace, o.selector, nodeName)
	if err != nil {
		return abortBundle(f, err)
	}
	remoteBundle := ""
	if f != nil {
		remoteBundle = fmt.Sprintf("%s/remediate-bundle-%d.tar.gz", remoteDir, time.Now().UnixNano())
	}
	argv, err := onceCommand(pod, o, nodeName, remoteBundle, extra)
	if err != nil {
		return abortBundle(f, err)
	}
	ex := d.newExecutor(cfg, client)
	fmt.Fprintf(stderr, "kubectl-remediate: running remediate --once in pod %s/%s on node %s\n", pod.Namespace, pod.Name, nodeName)
	if o.act && slices.Contains(argv[:len(argv)-len(extra)], "--dry-run") {
		fmt.Fprintf(stderr, "kubectl-remediate: the DaemonSet runs remediate with --dry-run: --act does not lift it, this run is a dry run too\n")
	}
	runErr := execToTerminal(ctx, ex, pod, o.ctr, argv, stdout, stderr)
	code, runErr := exitCode(runErr)
	if runErr != nil {
		return abortBundle(f, fmt.Errorf("exec in pod %s/%s: %w", pod.Namespace, pod.Name, runErr))
	}
	if f != nil {
		if err := copyBundle(ctx, ex, pod, o.ctr, remoteBundle, f, stderr); err != nil {
			fmt.Fprintf(stderr, "Error: %v\n", abortBundle(f, err))
			code = 1
		}
	}
	if code != 0 {
		return exitStatus(code)
	}
	return nil
}

// abortBundle removes the local bundle file of a run that failed.
func abortBundle(f *os.File, err error) error {
	if f != nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
	}
	return err
}

// exitCode maps remediate's exit in the pod: 0, 2 (findings) and 1 pass
// through; anything else (the exec itself failed) is an error.
func exitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee utilexec.ExitError
	if errors.As(err, &ee) && ee.Exited() {
		return ee.ExitStatus(), nil
	}
	return 1, err
}

// findPod returns the one running remediate pod on the node.
func findPod(ctx context.Context, c kubernetes.Interface, ns, selector, nodeName string) (*corev1.Pod, error) {
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector,
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", nodeName).String()})
	if err != nil {
		return nil, fmt.Errorf("listing pods in namespace %s (selector %s) on node %s: %w", ns, selector, nodeName, err)
	}
	return pickPod(list.Items, ns, selector, nodeName)
}

// pickPod returns the one running pod of items (the remediate pods on
// nodeName), or says why there is none.
func pickPod(items []corev1.Pod, ns, selector, nodeName string) (*corev1.Pod, error) {
	var running, other []string
	var pod *corev1.Pod
	for i := range items {
		p := &items[i]
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p.Name)
			pod = p
		} else {
			other = append(other, fmt.Sprintf("%s (%s)", p.Name, p.Status.Phase))
		}
	}
	switch {
	case len(running) == 1:
		return pod, nil
	case len(running) > 1:
		return nil, fmt.Errorf("%d running remediate pods on node %s in namespace %s (selector %s): %s; expected one (a DaemonSet pod per node)",
			len(running), nodeName, ns, selector, strings.Join(running, ", "))
	case len(other) > 0:
		return nil, fmt.Errorf("no running remediate pod on node %s in namespace %s (selector %s); not running: %s", nodeName, ns, selector, strings.Join(other, ", "))
	}
	return nil, fmt.Errorf("no remediate pod on node %s in namespace %s (selector %s): is the DaemonSet installed there (-n, -l)?", nodeName, ns, selector)
}

// onceCommand is the command run in the pod: the container's remediate
// with the daemon's own arguments (daemonArgs), --once, forced dry-run unless --act,
// and what was asked.
func onceCommand(pod *corev1.Pod, o *options, nodeName, remoteBundle string, extra []string) ([]string, error) {
	var ctr *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == o.ctr {
			ctr = &pod.Spec.Containers[i]
		}
	}
	if ctr == nil {
		return nil, fmt.Errorf("pod %s/%s has no container %q", pod.Namespace, pod.Name, o.ctr)
	}
	bin := entrypoint
	if len(ctr.Command) > 0 {
		bin = ctr.Command[0]
	}
	argv := append([]string{bin, "--once", "--node-name=" + nodeName}, daemonArgs(pod, ctr)...)
	if !o.act || daemonDryRun(pod, ctr) {
		argv = append(argv, "--dry-run")
	}
	argv = append(argv, "-o", o.output)
	if o.sample != "" {
		argv = append(argv, "--sample="+o.sample)
	}
	if remoteBundle != "" {
		argv = append(argv, "--bundle="+remoteBundle)
	}
	return append(argv, extra...), nil
}

// daemonDryRun reports whether the daemon itself runs with --dry-run (the
// platform team's fleet-wide dry run): --act does not lift it, an on-call
// run through the DaemonSet acts only where the DaemonSet would.
func daemonDryRun(pod *corev1.Pod, ctr *corev1.Container) bool {
	env := containerEnv(pod, ctr)
	dry := false
	for _, a := range append(append([]string(nil), ctr.Command[min(1, len(ctr.Command)):]...), ctr.Args...) {
		name, v, hasValue := strings.Cut(expandEnv(a, env), "=")
		if name != "--dry-run" {
			continue
		}
		if !hasValue {
			dry = true
			continue
		}
		b, err := strconv.ParseBool(v)
		dry = err != nil || b // a value the daemon would refuse: dry, to be safe
	}
	return dry
}

// copyBundle streams the remote bundle into f with cat, removes it in the
// pod, and checks the copy.
func copyBundle(ctx context.Context, ex Executor, pod *corev1.Pod, ctr, remotePath string, f *os.File, stderr io.Writer) error {
	lw := &limitedWriter{w: f, n: maxBundleCopy}
	var errb strings.Builder
	err := ex.Exec(ctx, pod, ctr, []string{"cat", remotePath}, lw, &errb)
	// Removed whatever happened: /tmp in the pod is small.
	var rmErr strings.Builder
	if rerr := ex.Exec(ctx, pod, ctr, []string{"rm", "-f", remotePath}, io.Discard, &rmErr); rerr != nil {
		fmt.Fprintf(stderr, "kubectl-remediate: could not remove %s in the pod: %v %s\n", remotePath, rerr, rmErr.String())
	}
	if err != nil {
		return fmt.Errorf("copying %s from the pod: %w: %s", remotePath, err, strings.TrimSpace(errb.String()))
	}
	if lw.cut {
		return fmt.Errorf("copying %s from the pod: larger than %d bytes", remotePath, maxBundleCopy)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	r, err := os.Open(f.Name())
	if err != nil {
		return err
	}
	defer r.Close()
	b, err := bundle.Read(r, bundle.Limits{MaxTotalBytes: maxBundleCopy})
	if err != nil {
		return fmt.Errorf("the copied bundle %s does not read: %w", f.Name(), err)
	}
	if len(b.Problems) > 0 {
		return fmt.Errorf("the copied bundle %s does not check: %s", f.Name(), strings.Join(b.Problems, "; "))
	}
	fmt.Fprintf(stderr, "kubectl-remediate: bundle %s (%d parts, checked; read it with: remediate bundle show %s)\n", f.Name(), len(b.Manifest.Parts), f.Name())
	return nil
}

type limitedWriter struct {
	w   io.Writer
	n   int64
	cut bool
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		l.cut = true
		return 0, errors.New("bundle too large")
	}
	l.n -= int64(len(p))
	return l.w.Write(p)
}

// apiExecutor runs commands through the API server's pods/exec
// subresource: WebSocket first, SPDY when the server cannot upgrade to it
// (what kubectl exec does).
type apiExecutor struct {
	cfg    *rest.Config
	client kubernetes.Interface
}

func (e *apiExecutor) Exec(ctx context.Context, pod *corev1.Pod, container string, cmd []string, stdout, stderr io.Writer) error {
	req := e.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	spdy, err := remotecommand.NewSPDYExecutor(e.cfg, "POST", req.URL())
	if err != nil {
		return err
	}
	ws, err := remotecommand.NewWebSocketExecutor(e.cfg, "GET", req.URL().String())
	if err != nil {
		return err
	}
	ex, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr})
}
