package kube

import (
	"bytes"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/remediate-dev/remediate/internal/boundedfile"
)

// ServiceAccountNamespaceFile is where the kubelet mounts the pod's
// namespace with its ServiceAccount token (client-go's in-cluster config
// reads the same file).
const ServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// NamespaceSource says where Namespace found the namespace.
type NamespaceSource string

// Where the namespace came from.
const (
	NamespaceFromEnv            NamespaceSource = "POD_NAMESPACE"
	NamespaceFromServiceAccount NamespaceSource = "service account"
	NamespaceDefault            NamespaceSource = "default"
)

// Namespace is the namespace of the daemon's own objects (its Leases, the
// fleet-pause ConfigMap): $POD_NAMESPACE (env, as the chart sets it from
// the downward API), else the pod's namespace from saFile (the service
// account mount: a DaemonSet deployed without the variable, in a
// namespace of its own, where its Role grants it), else kube-system. A
// value that is not a valid namespace name is passed over, as if unset.
func Namespace(env, saFile string) (string, NamespaceSource) {
	if validNamespace(env) {
		return env, NamespaceFromEnv
	}
	if saFile != "" {
		// A regular file of at most a name's length (and a newline),
		// read under boundedfile's deadline: a FIFO, a huge file or a
		// hung mount in its place is passed over, not waited on.
		if b, err := boundedfile.Read(saFile, 256); err == nil {
			if ns := string(bytes.TrimSpace(b)); validNamespace(ns) {
				return ns, NamespaceFromServiceAccount
			}
		}
	}
	return metav1.NamespaceSystem, NamespaceDefault
}

func validNamespace(ns string) bool {
	return ns != "" && len(validation.IsDNS1123Label(ns)) == 0
}
