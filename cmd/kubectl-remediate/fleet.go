package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/remediate-dev/remediate/internal/termsafe"
	"github.com/remediate-dev/remediate/remediate/exporters/fleetview"
)

// sortKeys are --sort-by's values.
var sortKeys = []string{"name", "status", "since", "heartbeat", "action"}

type fleetOptions struct {
	kubeconfig, context, namespace, eventNamespace, conditionType string
	nodeSelector, sortBy, output                                  string
	staleAfter, timeout                                           time.Duration
	pageSize                                                      int64
}

func fleetCmd(stdout io.Writer, d deps) *cobra.Command {
	o := &fleetOptions{}
	c := &cobra.Command{
		Use:   "fleet",
		Short: "Every node in one look, from what the daemons write (no exec)",
		Long: `Reads the node condition, the remediation Events, the budget and node-status
Leases and the fleet pause ConfigMap, and prints a row per node: the
condition's effective status (a heartbeat older than --stale-after is
Unknown) and since when, the heartbeat's age, the top finding, the last
action and its outcome, the budget slots held. Nodes and Events are listed
in pages (--page-size); --timeout bounds the whole. -o json's schema is in
docs/FLEET.md.`,
		Example: `  kubectl remediate fleet
  kubectl remediate fleet --sort-by status
  kubectl remediate fleet -o json | jq '.nodes[] | select(.status != "True")'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.output != "text" && o.output != "json" {
				return fmt.Errorf("--output must be text or json, got %q", o.output)
			}
			if !contains(sortKeys, o.sortBy) {
				return fmt.Errorf("--sort-by must be one of %s, got %q", strings.Join(sortKeys, ", "), o.sortBy)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			cfg, err := d.restConfig(o.kubeconfig, o.context)
			if err != nil {
				return fmt.Errorf("kubeconfig: %w", err)
			}
			cs, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				return err
			}
			now := time.Now()
			f, _, err := fleetview.Collect(ctx, cs, fleetview.CollectOptions{PageSize: o.pageSize, NodeSelector: o.nodeSelector,
				Options: fleetview.Options{Namespace: o.namespace, EventNamespace: o.eventNamespace, ConditionType: o.conditionType, StaleAfter: o.staleAfter}}, now)
			if err != nil {
				return err
			}
			sortNodes(f.Nodes, o.sortBy)
			if o.output == "json" {
				return encodeFleetJSON(stdout, &f)
			}
			printFleet(stdout, &f, now)
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context")
	fs.StringVarP(&o.namespace, "namespace", "n", defaultNamespace, "namespace of the remediate DaemonSet (its Leases and the fleet pause ConfigMap)")
	fs.StringVar(&o.eventNamespace, "event-namespace", "kube-system", "namespace of the Events about Nodes")
	fs.StringVar(&o.conditionType, "condition-type", "", "the Node condition remediate maintains (default KubeProxyDataplaneHealthy)")
	fs.StringVarP(&o.nodeSelector, "node-selector", "l", "", "only the Nodes with these labels")
	fs.StringVar(&o.sortBy, "sort-by", "name", "sort rows by "+strings.Join(sortKeys, ", ")+" (status: worst first; times: oldest first; action: newest first)")
	fs.StringVarP(&o.output, "output", "o", "text", "text or json")
	fs.DurationVar(&o.staleAfter, "stale-after", fleetview.DefaultStaleAfter, "a condition heartbeat older than this shows as Unknown")
	fs.DurationVar(&o.timeout, "timeout", time.Minute, "bound on the whole view")
	fs.Int64Var(&o.pageSize, "page-size", fleetview.DefaultPageSize, "LIST page size (limit/continue)")
	return c
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// statusRank orders statuses worst first.
func statusRank(s string) int {
	switch s {
	case "False":
		return 0
	case "Unknown":
		return 1
	case fleetview.StatusNone:
		return 2
	case "True":
		return 3
	}
	return 4
}

func timeOr(t *time.Time, def time.Time) time.Time {
	if t == nil {
		return def
	}
	return *t
}

// sortNodes orders rows by key, then by name.
func sortNodes(rows []fleetview.Node, key string) {
	far := time.Unix(1<<40, 0)
	less := func(a, b *fleetview.Node) (bool, bool) {
		switch key {
		case "status":
			ra, rb := statusRank(a.Status), statusRank(b.Status)
			return ra < rb, ra != rb
		case "since":
			ta, tb := timeOr(a.Since, far), timeOr(b.Since, far)
			return ta.Before(tb), !ta.Equal(tb)
		case "heartbeat":
			ta, tb := timeOr(a.Heartbeat, time.Time{}), timeOr(b.Heartbeat, time.Time{})
			return ta.Before(tb), !ta.Equal(tb)
		case "action":
			var ta, tb time.Time
			if a.LastAction != nil {
				ta = a.LastAction.Time
			}
			if b.LastAction != nil {
				tb = b.LastAction.Time
			}
			return ta.After(tb), !ta.Equal(tb)
		}
		return false, false
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if l, decided := less(&rows[i], &rows[j]); decided {
			return l
		}
		return rows[i].Name < rows[j].Name
	})
}

// age prints how long ago t was, kubectl's way (5s, 3m, 2h, 4d).
func age(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	d := now.Sub(*t)
	switch {
	case d < 0:
		return "0s"
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

func clipText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}

// encodeFleetJSON writes -o json: encoding/json's escaping, and the runes
// it leaves raw that a terminal acts on (C1, bidi) as \uXXXX too.
func encodeFleetJSON(w io.Writer, f *fleetview.Fleet) error {
	enc := json.NewEncoder(&termsafe.JSONWriter{W: w})
	enc.SetIndent("", "  ")
	return enc.Encode(f)
}

// printFleet writes the text view: the fleet-wide lines, then a table.
// Everything in it was written by someone else (a node's daemon, or any
// holder of its token: the condition's message, Lease fields, Events), so
// the whole view goes through termsafe (no escape sequence reaches the
// terminal) and each field through termsafe.Line (no field starts a
// forged line or column).
func printFleet(w io.Writer, f *fleetview.Fleet, now time.Time) {
	w = termsafe.NewWriter(w)
	l := termsafe.Line
	if f.Pause.Paused {
		fmt.Fprintf(w, "FLEET PAUSED: %s\n", l(f.Pause.Reason))
	} else {
		fmt.Fprintln(w, "Fleet pause: none")
	}
	held := 0
	for _, s := range f.Budget {
		if s.Holder != "" {
			held++
			fmt.Fprintf(w, "Budget slot %s: held by %s for %s on %s (%s), since %s ago\n", l(s.Lease), l(s.Holder), l(s.Action), l(s.Target), l(s.Rule), age(s.Since, now))
		}
	}
	if held == 0 {
		fmt.Fprintf(w, "Budget: %d slot Lease(s), none held\n", len(f.Budget))
	}
	count := map[string]int{}
	for _, n := range f.Nodes {
		count[n.Status]++
	}
	fmt.Fprintf(w, "Nodes: %d (%s: True %d, False %d, Unknown %d, None %d; stale after %s)\n", len(f.Nodes), l(f.ConditionType),
		count["True"], count["False"], count["Unknown"], count[fleetview.StatusNone], time.Duration(f.StaleAfterSeconds)*time.Second)
	for _, warn := range f.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", l(warn))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATUS\tSINCE\tHEARTBEAT\tTOP FINDING\tLAST ACTION\tBUDGET")
	for _, n := range f.Nodes {
		st := n.Status
		if n.Stale {
			st = fmt.Sprintf("Unknown(stale,was %s)", n.Reported)
		}
		act := "-"
		if a := n.LastAction; a != nil {
			act = fmt.Sprintf("%s %s %s ago", a.Action, a.Outcome, age(&a.Time, now))
			if a.Count > 1 {
				act += fmt.Sprintf(" (x%d)", a.Count)
			}
		}
		top := clipText(l(n.TopFinding), 60)
		if top == "" {
			top = "-"
		}
		budget := "-"
		if len(n.BudgetSlots) > 0 {
			budget = strings.Join(n.BudgetSlots, ",")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", l(n.Name), l(st), age(n.Since, now), age(n.Heartbeat, now), top, l(act), l(budget))
	}
	tw.Flush()
}
