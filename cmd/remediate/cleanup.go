package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/remediate-dev/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/internal/kube"
)

// runCleanup is `remediate cleanup`: remove from nodes what remediate put
// there (its Node condition; its cordon, taint and annotation), so an
// uninstall leaves nothing stale. The chart runs it as a pre-delete hook.
func runCleanup(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("cleanup", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster config)")
	node := fs.String("node", "", "only this node (default: every node)")
	cond := fs.String("condition-type", kubeexporter.DefaultConditionType, "the Node condition remediate maintains")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return exitOK
		}
		return exitError
	}
	c, err := kube.Connect(kube.Options{Kubeconfig: *kubeconfig})
	if err != nil {
		fmt.Fprintf(stderr, "remediate cleanup: %v\n", err)
		return exitError
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	done, err := kube.Cleanup(ctx, c.Interface, *node, *cond)
	names := make([]string, 0, len(done))
	for n := range done {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(stdout, "%s: removed %s\n", n, strings.Join(done[n], ", "))
	}
	if len(done) == 0 && err == nil {
		fmt.Fprintln(stdout, "nothing to clean up")
	}
	if err != nil {
		fmt.Fprintf(stderr, "remediate cleanup: %v\n", err)
		return exitError
	}
	return exitOK
}
