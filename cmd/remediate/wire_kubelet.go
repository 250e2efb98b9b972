package main

import (
	"sync"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/kubelet"
	"github.com/remediate-dev/remediate/internal/node"
)

// kubeletWiring is the scrape of this node's kubelet, built once (its
// transport re-reads the token file as it is rotated) and shared across
// policy reloads.
type kubeletWiring struct {
	once   sync.Once
	client *kubelet.Client
	why    string
}

// wireKubelet sets the kubelet adapter (subsystem "kubelet"):
// KubeletPodStartup's authenticated /metrics, at --kubelet-metrics-url or
// at the address and port this node's Node object gives, with the
// credentials of the API client (not its TLS settings: the kubelet's
// serving certificate is checked against --kubelet-ca, else the cluster's
// CA, unless --kubelet-insecure-tls: then only this host's addresses, and
// only a root-owned listener, get the token; the API configuration's own
// insecure-skip-tls-verify is never used for the kubelet).
func (w *wiring) wireKubelet(n *node.Node) {
	kw := &w.kubelet
	kw.once.Do(func() {
		k := w.kube()
		if k.client == nil {
			kw.why = "the kubelet checks the ServiceAccount's token, and there is no cluster access: " + k.noAccess
			return
		}
		// A fresh configuration: the client's own counts every answer as
		// the API server's (its contact tracker).
		cfg, err := kube.RESTConfig(w.o.kubeconfig)
		if err != nil {
			kw.why = err.Error()
			return
		}
		o := kubelet.Options{URL: w.o.kubeletURL, Auth: cfg, CAFile: w.o.kubeletCA, InsecureTLS: w.o.kubeletInsecureTLS}
		if o.URL == "" {
			o.Address = func() (string, int, error) {
				nd, _ := k.nodes.Node()
				return kubelet.NodeAddress(nd)
			}
		}
		c, err := kubelet.New(o)
		if err != nil {
			kw.why = err.Error()
			return
		}
		kw.client = c
	})
	if kw.client == nil {
		n.Unavailable["kubelet"] = kw.why
		return
	}
	n.Kubelet = kw.client
}
