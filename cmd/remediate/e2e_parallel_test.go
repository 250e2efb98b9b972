package main

import "testing"

// parallelE2E marks an end-to-end test of the real control plane as one
// that runs beside the others (t.Parallel): most of such a test's time is
// waiting (for kube-proxy's syncs, the daemon's cycles, a grace period), so
// the package's TestE2E* tests take about as long as the longest few rather
// than their sum. `go test` runs -parallel of them at a time (GOMAXPROCS by
// default; make test passes -parallel, see the Makefile) and only once every
// test that is not parallel has finished, so none of them runs beside the
// tests that use the host's xtables lock, iptables or environment.
//
// What makes that sound, and what a test calling it must keep true:
//   - its control plane is its own (controlplane.Start, never Shared):
//     etcd, kube-apiserver and kube-proxy in a network namespace the test
//     made, so ports, iptables and nftables rules and conntrack are its
//     own; kube-proxy's iptables-legacy and the test's (netnsRun) take a
//     lock file of the test's, not the host's /run/xtables.lock;
//   - the daemons it runs are in that namespace and tell their node's
//     kube-proxy from the other tests' by it (and by its pod's cgroup), as
//     they already do beside the other packages' tests under go test ./...;
//   - it keeps to its own folders (t.TempDir), cgroups (podcgroup, named
//     after the test binary and a tag no other test uses) and environment:
//     no t.Setenv (it panics in a parallel test); a child's environment is
//     given to the child (onceInNetNSEnv, cmd.Env);
//   - nothing it asserts depends on the host being otherwise idle beyond
//     the margins its timeouts already allow on a loaded 2-core machine.
func parallelE2E(t *testing.T) {
	t.Helper()
	t.Parallel()
}
