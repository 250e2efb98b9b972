package prometheusexporter

import "github.com/prometheus/client_golang/prometheus"

// newNodeInfo is remediate_node_info{node="<--node-name>"} 1: the one
// series that names this daemon's node. The default install serves /metrics
// on the node's loopback, scraped by a node-local agent whose targets carry
// no node label (only job and instance); the fleet dashboard joins this
// series on (job, instance) to give every other series its node, so they
// need no node label of their own (deploy/README.md, Metrics).
func newNodeInfo(node string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "remediate_node_info",
		Help:        "1, with the node this daemon watches (--node-name) as label node; join on (job, instance) to give other series their node.",
		ConstLabels: prometheus.Labels{"node": node},
	})
	g.Set(1)
	return g
}
