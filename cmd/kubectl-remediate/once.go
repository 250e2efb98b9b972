package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/remediate-dev/remediate/internal/termsafe"
	"github.com/remediate-dev/remediate/remediate/exporters/fleetview"
)

// Bounds of the many-node run.
const (
	defaultParallel = 4
	maxParallel     = 64
	// maxNodeOutput bounds what is kept of one node's report (stdout) and
	// maxNodeStderr of its stderr: 5,000 nodes stay within memory.
	maxNodeOutput = 4 << 20
	maxNodeStderr = 64 << 10
)

type onceOptions struct {
	options
	allNodes     bool
	nodeSelector string
	parallel     int
	nodeTimeout  time.Duration
}

// nodeResult is one node's run in the merged report (-o json: "nodes").
type nodeResult struct {
	Node string `json:"node"`
	Pod  string `json:"pod,omitempty"`
	// Exit is remediate's exit status on that node (0 no findings, 2
	// findings, 1 error), 1 when it could not be run.
	Exit            int     `json:"exit"`
	Error           string  `json:"error,omitempty"`
	DurationSeconds float64 `json:"durationSeconds"`
	// Report is remediate's JSON report (-o json) when it parsed, else
	// Output holds what it printed.
	Report json.RawMessage `json:"report,omitempty"`
	Output string          `json:"output,omitempty"`
	Stderr string          `json:"stderr,omitempty"`
	// DryRunForced: --act was asked, but the DaemonSet runs remediate with
	// --dry-run, which --act does not lift: the run was a dry run.
	DryRunForced bool `json:"dryRunForced,omitempty"`
}

// mergedReport is -o json's output of `kubectl remediate once` on several
// nodes.
type mergedReport struct {
	SchemaVersion int          `json:"schemaVersion"`
	Exit          int          `json:"exit"`
	Counts        map[int]int  `json:"counts"`
	Nodes         []nodeResult `json:"nodes"`
}

func onceCmd(stdout, stderr io.Writer, d deps) *cobra.Command {
	o := &onceOptions{}
	c := &cobra.Command{
		Use:   "once [NODE...] [--all-nodes | -l NODE-SELECTOR] [flags] [-- REMEDIATE-FLAGS...]",
		Short: "Run remediate --once on many nodes through their DaemonSet pods",
		Long: `Runs remediate --once, as kubectl remediate NODE does, on the named nodes, on
the nodes matching -l, or on every node with a remediate pod (--all-nodes):
at most --parallel at a time, each bounded by --node-timeout, all by
--timeout. Prints each node's report and a summary (-o json: one merged
document, docs/FLEET.md); exits with the worst status: 1 if any node
errored or was not run, else 2 if any has findings, else 0.`,
		Example: `  kubectl remediate once --all-nodes
  kubectl remediate once -l node-role.kubernetes.io/worker= --parallel 8 -o json
  kubectl remediate once node1 node2`,
		RunE: func(cmd *cobra.Command, args []string) error {
			dash := cmd.ArgsLenAtDash()
			var extra []string
			if dash >= 0 {
				args, extra = args[:dash], args[dash:]
			}
			n := 0
			for _, set := range []bool{len(args) > 0, o.allNodes, o.nodeSelector != ""} {
				if set {
					n++
				}
			}
			if n != 1 {
				return errors.New("give exactly one of: NODE names, --all-nodes, -l NODE-SELECTOR")
			}
			if o.output != "text" && o.output != "json" {
				return fmt.Errorf("--output must be text or json, got %q", o.output)
			}
			if o.parallel < 1 || o.parallel > maxParallel {
				return fmt.Errorf("--parallel must be 1..%d, got %d", maxParallel, o.parallel)
			}
			rep, err := runMany(cmd.Context(), o, args, extra, stderr, d)
			if err != nil {
				return err
			}
			if o.output == "json" {
				enc := json.NewEncoder(&termsafe.JSONWriter{W: stdout})
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return err
				}
			} else {
				printMerged(stdout, rep)
			}
			if rep.Exit != 0 {
				return exitStatus(rep.Exit)
			}
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context")
	fs.StringVarP(&o.namespace, "namespace", "n", defaultNamespace, "namespace of the remediate DaemonSet")
	fs.StringVar(&o.selector, "pod-selector", defaultSelector, "label selector of the remediate pods")
	fs.StringVarP(&o.ctr, "container", "c", defaultContainer, "the remediate container")
	fs.StringVar(&o.sample, "sample", "", "remediate's --sample (default: remediate's, 10s)")
	fs.StringVarP(&o.output, "output", "o", "text", "report format: text or json")
	fs.BoolVar(&o.act, "act", false, "let the runs act as the daemon's policy says (default: --dry-run); the cluster budget still bounds disruptive actions")
	fs.BoolVar(&o.allNodes, "all-nodes", false, "every node with a remediate pod")
	fs.StringVarP(&o.nodeSelector, "node-selector", "l", "", "the Nodes with these labels")
	fs.IntVar(&o.parallel, "parallel", defaultParallel, "nodes run at once")
	fs.DurationVar(&o.nodeTimeout, "node-timeout", 3*time.Minute, "bound on one node's run")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Minute, "bound on the whole; nodes not started by then are reported not run")
	return c
}

// runMany resolves the nodes and their pods and runs them.
func runMany(ctx context.Context, o *onceOptions, names, extra []string, stderr io.Writer, d deps) (*mergedReport, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cfg, err := d.restConfig(o.kubeconfig, o.context)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	pods, err := listAll(ctx, func(opts metav1.ListOptions) ([]corev1.Pod, string, error) {
		opts.LabelSelector = o.selector
		l, err := client.CoreV1().Pods(o.namespace).List(ctx, opts)
		if err != nil {
			return nil, "", err
		}
		return l.Items, l.Continue, nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing pods in namespace %s (selector %s): %w", o.namespace, o.selector, err)
	}
	byNode := map[string][]corev1.Pod{}
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			byNode[p.Spec.NodeName] = append(byNode[p.Spec.NodeName], p)
		}
	}
	switch {
	case o.allNodes:
		for n := range byNode {
			names = append(names, n)
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("no remediate pod in namespace %s (selector %s): is the DaemonSet installed (-n, --pod-selector)?", o.namespace, o.selector)
		}
	case o.nodeSelector != "":
		nodes, err := listAll(ctx, func(opts metav1.ListOptions) ([]corev1.Node, string, error) {
			opts.LabelSelector = o.nodeSelector
			l, err := client.CoreV1().Nodes().List(ctx, opts)
			if err != nil {
				return nil, "", err
			}
			return l.Items, l.Continue, nil
		})
		if err != nil {
			return nil, fmt.Errorf("listing nodes (selector %s): %w", o.nodeSelector, err)
		}
		for _, n := range nodes {
			names = append(names, n.Name)
		}
		if len(names) == 0 {
			return nil, fmt.Errorf("no node matches -l %s", o.nodeSelector)
		}
	}
	sort.Strings(names)
	names = compactSorted(names)
	ex := d.newExecutor(cfg, client)
	fmt.Fprintf(stderr, "kubectl-remediate: running remediate --once on %d node(s), %d at a time\n", len(names), o.parallel)
	results := runNodes(ctx, names, o.parallel, func(ctx context.Context, node string) nodeResult {
		pod, err := pickPod(byNode[node], o.namespace, o.selector, node)
		if err != nil {
			return nodeResult{Node: node, Exit: 1, Error: err.Error()}
		}
		return runOne(ctx, ex, pod, o, node, extra)
	})
	return merge(results), nil
}

func compactSorted(l []string) []string {
	out := l[:0]
	for i, s := range l {
		if i == 0 || s != l[i-1] {
			out = append(out, s)
		}
	}
	return out
}

// listAll runs a paginated LIST (fleetview.DefaultPageSize a page, at
// most fleetview.MaxPages pages).
func listAll[T any](ctx context.Context, list func(metav1.ListOptions) ([]T, string, error)) ([]T, error) {
	var all []T
	cont := ""
	for i := 0; i < fleetview.MaxPages; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		items, next, err := list(metav1.ListOptions{Limit: fleetview.DefaultPageSize, Continue: cont})
		if err != nil {
			return nil, err
		}
		all = append(all, items...)
		if next == "" {
			return all, nil
		}
		cont = next
	}
	return nil, fmt.Errorf("more than %d pages", fleetview.MaxPages)
}

// runNodes calls run for every node, at most parallel at once, and
// returns the results in names' order. Once ctx is done no node starts:
// those are reported not run (exit 1).
func runNodes(ctx context.Context, names []string, parallel int, run func(context.Context, string) nodeResult) []nodeResult {
	results := make([]nodeResult, len(names))
	next := make(chan int)
	var wg sync.WaitGroup
	for w := 0; w < min(parallel, len(names)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := ctx.Err(); err != nil {
					results[i] = nodeResult{Node: names[i], Exit: 1, Error: "not run: " + err.Error() + " (--timeout)"}
					continue
				}
				start := time.Now()
				r := run(ctx, names[i])
				r.Node = names[i]
				r.DurationSeconds = time.Since(start).Round(time.Millisecond).Seconds()
				results[i] = r
			}
		}()
	}
	for i := range names {
		next <- i
	}
	close(next)
	wg.Wait()
	return results
}

// runOne runs remediate --once in pod, bounded by --node-timeout.
func runOne(ctx context.Context, ex Executor, pod *corev1.Pod, o *onceOptions, node string, extra []string) nodeResult {
	ctx, cancel := context.WithTimeout(ctx, o.nodeTimeout)
	defer cancel()
	r := nodeResult{Node: node, Pod: pod.Namespace + "/" + pod.Name}
	argv, err := onceCommand(pod, &o.options, node, "", extra)
	if err != nil {
		r.Exit, r.Error = 1, err.Error()
		return r
	}
	r.DryRunForced = o.act && slices.Contains(argv[:len(argv)-len(extra)], "--dry-run")
	out := &capWriter{n: maxNodeOutput}
	errb := &capWriter{n: maxNodeStderr}
	code, err := exitCode(ex.Exec(ctx, pod, o.ctr, argv, out, errb))
	r.Exit = code
	if err != nil {
		r.Exit, r.Error = 1, fmt.Sprintf("exec in pod %s: %v", r.Pod, err)
	}
	if out.cut {
		r.Exit, r.Error = 1, fmt.Sprintf("report larger than %d bytes: cut", maxNodeOutput)
	}
	if o.output == "json" && json.Valid(out.b.Bytes()) {
		r.Report = json.RawMessage(bytes.TrimSpace(out.b.Bytes()))
	} else {
		r.Output = out.b.String()
	}
	r.Stderr = errb.b.String()
	return r
}

// capWriter keeps the first n bytes and says whether more came (the rest
// is discarded, not an error: the remote side must not block).
type capWriter struct {
	b   bytes.Buffer
	n   int
	cut bool
}

func (c *capWriter) Write(p []byte) (int, error) {
	if room := c.n - c.b.Len(); len(p) > room {
		c.cut = true
		c.b.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.b.Write(p)
}

// worse orders remediate's exit statuses: an error (1, or anything but 0
// and 2) is worse than findings (2), which is worse than none (0). An
// error is worst because it hides what the node has.
func worse(a, b int) int {
	rank := func(c int) int {
		switch c {
		case 0:
			return 0
		case 2:
			return 1
		}
		return 2
	}
	if rank(b) > rank(a) {
		return b
	}
	return a
}

// merge is the merged report of results: the worst exit status and the
// count of each.
func merge(results []nodeResult) *mergedReport {
	m := &mergedReport{SchemaVersion: 1, Counts: map[int]int{}, Nodes: results}
	for _, r := range results {
		if r.Exit != 0 && r.Exit != 2 {
			r.Exit = 1
		}
		m.Counts[r.Exit]++
		m.Exit = worse(m.Exit, r.Exit)
	}
	return m
}

// printMerged prints each node's report, then the summary. What a node's
// pod printed is outside text to this terminal: it goes through termsafe.
func printMerged(w io.Writer, m *mergedReport) {
	w = termsafe.NewWriter(w)
	for _, r := range m.Nodes {
		fmt.Fprintf(w, "=== node %s (pod %s): exit %d\n", r.Node, orDash(r.Pod), r.Exit)
		if r.DryRunForced {
			fmt.Fprintln(w, "NOTE: the DaemonSet runs remediate with --dry-run: --act does not lift it, this run was a dry run")
		}
		if r.Error != "" {
			fmt.Fprintf(w, "ERROR: %s\n", r.Error)
		}
		out := r.Output
		if len(r.Report) > 0 {
			out = string(r.Report)
		}
		if out != "" {
			fmt.Fprint(w, out)
			if !strings.HasSuffix(out, "\n") {
				fmt.Fprintln(w)
			}
		}
	}
	fmt.Fprintf(w, "=== summary: %d node(s): %d no findings, %d findings, %d errors or not run; exit %d\n",
		len(m.Nodes), m.Counts[0], m.Counts[2], m.Counts[1], m.Exit)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tEXIT\tSECONDS\tERROR")
	for _, r := range m.Nodes {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%s\n", r.Node, r.Exit, r.DurationSeconds, orDash(clipText(r.Error, 100)))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
