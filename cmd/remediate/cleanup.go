package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
)

// newCleanupCmd is `remediate cleanup`: remove from nodes what remediate
// put there (its Node condition; its cordon, taint and annotation), so an
// uninstall leaves nothing stale; with --lease-namespace, also the daemons'
// budget and storm Leases there. The chart runs it as a pre-delete hook.
func newCleanupCmd(stdout, stderr io.Writer) *cobra.Command {
	var kubeconfig, node, cond, leaseNS string
	var timeout time.Duration
	cc := &cobra.Command{
		Use:     "cleanup",
		Short:   "Remove remediate's Node condition, cordon and taint from nodes (run on uninstall)",
		Example: "  remediate cleanup --node worker-1\n  remediate cleanup            # every node",
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if kubeconfig == "" {
				// Like kubectl: $KUBECONFIG, then in-cluster.
				if env := os.Getenv("KUBECONFIG"); env != "" {
					if list := filepath.SplitList(env); len(list) > 1 {
						fmt.Fprintf(stderr, "remediate cleanup: $KUBECONFIG names %d files (%s); give one with --kubeconfig\n", len(list), env)
						return exitStatus(exitError)
					}
					kubeconfig = env
				}
			}
			c, err := kube.Connect(kube.Options{Kubeconfig: kubeconfig})
			if err != nil {
				if kubeconfig == "" {
					// Neither the flag nor $KUBECONFIG: say both.
					err = fmt.Errorf("%w, $KUBECONFIG unset", err)
				}
				fmt.Fprintf(stderr, "remediate cleanup: %v\n", err)
				return exitStatus(exitError)
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			done, err := kube.Cleanup(ctx, c.Interface, node, cond)
			names := make([]string, 0, len(done))
			for n := range done {
				names = append(names, n)
			}
			sort.Strings(names)
			for _, n := range names {
				fmt.Fprintf(stdout, "%s: removed %s\n", n, strings.Join(done[n], ", "))
			}
			var leases []string
			if leaseNS != "" {
				var lerr error
				leases, lerr = kube.CleanupLeases(ctx, c.Interface, leaseNS)
				for _, l := range leases {
					fmt.Fprintf(stdout, "lease %s/%s: deleted\n", leaseNS, l)
				}
				if err == nil {
					err = lerr
				}
			}
			if len(done) == 0 && len(leases) == 0 && err == nil {
				fmt.Fprintln(stdout, "nothing to clean up")
			}
			if err != nil {
				fmt.Fprintf(stderr, "remediate cleanup: %v\n", err)
				return exitStatus(exitError)
			}
			return nil
		},
	}
	cc.Flags().StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, else the in-cluster config)")
	cc.Flags().StringVar(&node, "node", "", "only this node (default: every node)")
	cc.Flags().StringVar(&cond, "condition-type", kubeexporter.DefaultConditionType, "the Node condition remediate maintains")
	cc.Flags().StringVar(&leaseNS, "lease-namespace", "", "also delete the daemons' Leases (remediate-budget-*, remediate-node-*) in this namespace (the chart's hook passes the release namespace)")
	cc.Flags().DurationVar(&timeout, "timeout", 2*time.Minute, "give up after this long")
	return cc
}
