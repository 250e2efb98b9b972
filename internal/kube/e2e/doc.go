// Package e2e holds the end-to-end tests of the Kubernetes integration
// against a real kube-apiserver and etcd (internal/testing/controlplane):
// the deploy/ manifests, the ServiceAccount's permissions, the cluster-wide
// budget across several daemons, events and conditions, behaviour with the
// apiserver stopped, and the cluster view's memory and request benchmark.
// It has no non-test code.
package e2e
