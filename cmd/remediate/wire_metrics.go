package main

import (
	"time"

	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/remediate/exporters/prometheusexporter"
)

// metricsSources wires the exporter's scrape-time reads to the current
// adapters' last observations.
func (w *wiring) metricsSources(node string) prometheusexporter.Sources {
	return prometheusexporter.Sources{
		Node:                node,
		FleetPaused:         w.fleetPaused,
		KubeProxyScrape:     w.lastKubeProxyScrape,
		KubeProxySyncPeriod: w.kubeProxySyncPeriod,
		LockWatcher:         w.lockWatch.Load,
		IPTablesSaves: func() []*iptables.Snapshot {
			if s := w.ipt.Load(); s != nil {
				return s.LastSnapshots()
			}
			return nil
		},
		IPTablesReads: func() []iptables.Reads {
			if s := w.ipt.Load(); s != nil {
				return s.Reads()
			}
			return nil
		},
		Conntrack: func() (conntrack.Usage, bool) {
			if ct := w.ct.Load(); ct != nil {
				return ct.LastUsage()
			}
			return conntrack.Usage{}, false
		},
		IPVS: func() (ipvs.Counts, bool) {
			if h := w.ipvsLast.Load(); h != nil {
				return h.LastCounts()
			}
			return ipvs.Counts{}, false
		},
	}
}

// lastKubeProxyScrape is the current kube-proxy client's last scrape.
func (w *wiring) lastKubeProxyScrape() *kubeproxy.Scrape {
	if kp := w.kp.Load(); kp != nil {
		return kp.LastScrape()
	}
	return nil
}

// kubeProxySyncPeriod is the syncPeriod the current kube-proxy client uses
// (its /configz, else the policy's), or the starting policy's before there
// is a client.
func (w *wiring) kubeProxySyncPeriod() time.Duration {
	if kp := w.kp.Load(); kp != nil {
		return kp.SyncPeriod()
	}
	if w.pol != nil {
		return w.pol.KubeProxy.SyncPeriod.Duration
	}
	return 0
}
