// Command remediate keeps a Kubernetes node's service data plane healthy: it
// detects kube-proxy faults and remedies them under guardrails.
//
//	remediate [flags]            run the daemon loop
//	remediate --once [flags]     one detection pass plus decisions, then exit
//	remediate policy check FILE...   validate policies (exit 1 on any error)
//	remediate policy show FILE       print the effective policy (defaults included)
//	remediate policy types           list detector and action types
//	remediate journal [--state-dir DIR]   print the audit journal
//	remediate cleanup [--node N]     remove remediate's Node condition, cordon and taint (uninstall)
//	remediate version
//
// This package only parses flags, wires the node's adapters and calls the
// engine; the logic lives in packages policy, detect and remediate.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	os.Exit(Run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}
