// Package e2e holds the end-to-end tests of the Kubernetes integration
// against a real kube-apiserver and etcd (internal/testing/controlplane):
// the deploy/ manifests, the ServiceAccount's permissions, the cluster-wide
// budget across several daemons (and the budget and storm guard at 50 to
// 200 nodes, TestGuardrailsAtN), events and conditions, behaviour with the
// apiserver stopped, and the cluster view's memory and request benchmark.
// It has no non-test code.
package e2e
