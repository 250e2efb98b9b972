// Command remediate keeps a Kubernetes node's service data plane healthy: it
// detects kube-proxy faults and remedies them under guardrails.
//
//	remediate [flags]            run the daemon loop
//	remediate --once [flags]     one detection pass plus decisions, then exit
//	remediate policy check FILE...   validate policies (exit 1 on any error)
//	remediate policy show FILE       print the effective policy (defaults included)
//	remediate policy types           list detector and action types with their parameters
//	remediate journal [--state-dir DIR]   print the audit journal
//	remediate cleanup [--node N]     remove remediate's Node condition, cordon and taint (uninstall)
//	remediate version | --version
//	remediate completion bash|zsh|fish|powershell
//
// The command tree is cobra's (cli.go); this package only parses flags,
// wires the node's adapters and calls the engine; the logic lives in
// packages policy, detect and remediate.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	if code, ok := superviseOnce(os.Args[1:]); ok {
		os.Exit(code)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(childExitCode(Run(ctx, os.Args[1:], os.Stdout, os.Stderr)))
}

// exitCode turns a command's result into the exit status, printing what is
// left to say: a usage mistake with a pointer to the command's --help
// (exit 1), any other error (exit 1). An exitStatus was already explained
// by the command (findings: 2, invalid policy: 1).
func exitCode(cmd *cobra.Command, err error, stderr io.Writer) int {
	var st exitStatus
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &st):
		return int(st)
	case errors.As(err, &ue):
		path := "remediate"
		if cmd != nil {
			path = cmd.CommandPath()
		}
		fmt.Fprintf(stderr, "Error: %s\nSee '%s --help' for usage.\n", ue.msg, path)
	default:
		fmt.Fprintf(stderr, "Error: %v\n", err)
	}
	return exitError
}
