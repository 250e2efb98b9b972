package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/cnichains"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/cpustat"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/lockwatch"
	"github.com/remediate-dev/remediate/internal/memlimit"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/probe"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// wiring builds the node's adapters from the flags and the policy, and
// holds what must be closed at exit.
type wiring struct {
	o       *options
	pol     *policy.Policy // the policy at start (cluster-wide settings)
	log     *zap.Logger
	closers []func()
	k       kubeWiring    // Kubernetes client, view, reporter (wire_kube.go)
	kubelet kubeletWiring // this node's kubelet /metrics (wire_kubelet.go)

	// ipvs is created once and shared across policy reloads.
	ipvs *ipvs.Handle
	// lockWatch measures xtables lock holds; created once (shared across
	// reloads, so its history survives them), started by the first
	// XtablesLockContention run, stopped by Close.
	lockWatch atomic.Pointer[lockwatch.Watcher]
	// noPriv: subsystems this process lacks the privileges for (read once).
	noPriv map[string]string
	// kp is the kube-proxy client of the current policy (its last scrape
	// is exported by kubeProxySyncCollector).
	kp atomic.Pointer[kubeproxy.Client]
	// ipt, ct and ipvsLast are the current iptables, conntrack and IPVS
	// adapters, whose last observations trendCollector exports.
	ipt      atomic.Pointer[iptables.Shared]
	ct       atomic.Pointer[conntrack.Real]
	ipvsLast atomic.Pointer[ipvs.Handle]
	// initPages: the binary's init-only pages are given back after the
	// first cycle.
	initPages sync.Once
}

func newWiring(o *options, pol *policy.Policy, log *zap.Logger) *wiring {
	w := &wiring{o: o, pol: pol, log: log, noPriv: readPrivileges().missing()}
	logPrivileges(log, w.noPriv)
	return w
}

// Node builds the node for a policy; it is called at start and on every
// policy reload (the kube-proxy endpoints come from the policy).
func (w *wiring) Node(p *policy.Policy) (*node.Node, error) {
	n := &node.Node{
		Name:        w.o.nodeName,
		ProcRoot:    w.o.procRoot,
		HostRoot:    w.o.hostRoot,
		XtablesLock: w.o.xtablesLock,
		CNIConfDir:  w.o.cniConfDir,
		CNIBinDir:   w.o.cniBinDir,
		Clock:       clock.RealClock{},
		Log:         w.log,
		Unavailable: map[string]string{},
	}
	// --- wire adapters here: one block per subsystem, setting the
	// node's adapter field or n.Unavailable["<subsystem>"] = reason. ---

	wireCNIIPAM(n, w.o) // cri: host-local's store and the runtime's sandboxes
	w.wireKubelet(n)    // kubelet: its authenticated /metrics

	// procs: processes and file locks read through --proc-root. Signals go
	// to PIDs of this process's PID namespace, so --proc-root must be that
	// namespace's procfs (hostPID: true in the DaemonSet).
	if _, err := os.Stat(filepath.Join(w.o.procRoot, "locks")); err != nil {
		n.Unavailable["procs"] = fmt.Sprintf("proc root %s is not a readable procfs: %v", w.o.procRoot, err)
	} else {
		n.Procs = procs.New(w.o.procRoot)
		warnPIDNamespace(w.log, n.Procs)
		if l, err := procident.NewListening(w.o.cgroupRoot, n.Procs); err != nil {
			w.log.Info("kube-proxy is found by its name only", zap.Error(err))
		} else {
			n.Listening = l
			n.KubeProxyPorts = procident.PortsOf(p.KubeProxy.MetricsURL, p.KubeProxy.HealthzURL)
		}
		if w.lockWatch.Load() == nil {
			lw := lockwatch.New(lockwatch.Config{ProcRoot: w.o.procRoot, LockFile: w.o.xtablesLock,
				Procs: n.Procs, Log: w.log.Named("lockwatch")})
			w.lockWatch.Store(lw)
			w.closers = append(w.closers, lw.Close)
		}
		n.XtablesLockWatch = w.lockWatch.Load()
		// The likely causes read the lock holds of their window from it.
		n.LockHistory = w.lockWatch.Load()
	}
	// iptables: rule sets read with iptables-{legacy,nft}-save in this
	// network namespace (hostNetwork: true), never through the xtables
	// lock. A missing save command makes the detector skip that backend.
	// Shared: the detectors of one cycle (IPTablesRules, DataplaneDrift)
	// get one save per family and backend, not one each.
	// Created once: the kept saves and their change checks survive policy
	// reloads. The xtables lock file is watched (never taken) to tell when
	// a legacy table's entries need reading again (iptables.Config.LockFile).
	// A changed legacy IPv4 table is decoded from the entries the change
	// check read, not saved; what it cannot decode is saved (logged once).
	if w.ipt.Load() == nil {
		w.ipt.Store(iptables.NewShared(iptables.New(iptables.Config{LockFile: w.o.xtablesLock,
			Log: func(f iptables.Family, reason string) {
				w.log.Info("legacy iptables entries not decodable: saving instead", zap.String("family", string(f)), zap.String("reason", reason))
			}}), 2*time.Second))
	}
	n.IPTables = w.ipt.Load()
	// nftables: the ruleset listed read-only with `nft -j list ruleset`
	// in this network namespace, bounded in time and size, one listing
	// shared by the nftables detectors of a cycle. Without nft they skip
	// ("nft unavailable").
	nftTTL := nftables.DefaultCacheTTL
	if half := p.Interval.Duration / 2; half > 0 && half < nftTTL {
		nftTTL = half
	}
	n.NFTables = nftables.New(nftables.Config{CacheTTL: nftTTL})
	// IPVS: the adapter does not touch the kernel until first use; on a
	// kernel without ip_vs every IPVS detector and action skips with
	// "IPVS unavailable: ..." (checked at each use, so a module loaded
	// later is picked up).
	if w.ipvs == nil {
		h := ipvs.New(ipvs.Options{ProcRoot: w.o.procRoot})
		w.ipvs = h
		w.closers = append(w.closers, func() {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = h.Close(ctx)
		})
	}
	n.IPVS = w.ipvs
	w.ipvsLast.Store(w.ipvs)
	// conntrack: the table of the daemon's network namespace over
	// ctnetlink (hostNetwork in the DaemonSet), tunables under --proc-root
	// and --sys-root, the last nf_conntrack_max set recorded in --state-dir
	// (for drift after a kube-proxy restart).
	if err := conntrack.Available(w.o.procRoot); err != nil {
		n.Unavailable["conntrack"] = err.Error()
	} else {
		ct := conntrack.New(conntrack.Config{ProcRoot: w.o.procRoot, SysRoot: w.o.sysRoot, StateDir: w.o.stateDir})
		n.Conntrack = ct
		w.ct.Store(ct)
	}

	// cnichains: what CNIAgentChains remembers of the CNI agents' chains,
	// in --state-dir (it survives a restart).
	if w.o.stateDir != "" {
		n.CNIChains = &cnichains.FileStore{Dir: w.o.stateDir}
	}

	// cpustat: kube-proxy's cgroup cpu.stat (found from /proc/<pid>/cgroup
	// under --proc-root, read under --cgroup-root) and /proc/stat, for the
	// likely causes the kube-proxy symptom findings carry.
	n.CPU = cpustat.New(cpustat.Config{ProcRoot: w.o.procRoot, CgroupRoot: w.o.cgroupRoot})

	// kube-proxy: its /metrics, /healthz and /proxyMode over HTTP, at the
	// policy's URLs, each read bounded by scrapeTimeout and shared by the
	// kube-proxy detectors of a cycle (cached for at most half an interval).
	kpTTL := kubeproxy.DefaultCacheTTL
	if half := p.Interval.Duration / 2; half > 0 && half < kpTTL {
		kpTTL = half
	}
	if kp, err := kubeproxy.New(kubeproxy.Options{
		MetricsURL:   p.KubeProxy.MetricsURL,
		HealthzURL:   p.KubeProxy.HealthzURL,
		ProxyModeURL: p.KubeProxy.ProxyModeURL,
		SyncPeriod:   p.KubeProxy.SyncPeriod.Duration,
		Timeout:      p.KubeProxy.ScrapeTimeout.Duration,
		CacheTTL:     kpTTL,
	}); err != nil {
		n.Unavailable["kube-proxy"] = err.Error()
	} else {
		n.KubeProxy = kp
		w.kp.Store(kp)
	}

	// probe: TCP connects (connect, close, no payload) from this network
	// namespace (the node's, with hostNetwork) for ServicePathProbe; each
	// bounded by the rule's connectTimeout, at most maxConnects per run.
	n.Probe = probe.New(probe.Options{})

	// kubernetes: the API client and the Services/EndpointSlices view
	// (in-cluster or --kubeconfig; built once, shared across reloads).
	if k := w.kube(); k.client != nil {
		n.Kube, n.Cluster = k.client.Interface, k.view
		if k.pods != nil {
			n.Pods = k.pods
		}
		// The kubelet's sandbox Events of a stuck pod, read on demand
		// (PodsNetworkNotReady; one field-selected LIST per pod).
		if k.events != nil {
			n.PodEvents = k.events
		}
	} else {
		n.Unavailable["kubernetes"] = k.noAccess
	}
	applyPrivileges(n, w.noPriv)
	if n.Procs == nil {
		// Without the privileges to read other processes the lock is not
		// watched either (its holders could not be named).
		n.XtablesLockWatch, n.LockHistory = nil, nil
	}
	return n, nil
}

// OnReport publishes a daemon cycle's report (events, node conditions).
func (w *wiring) OnReport(ctx context.Context, rep *remediate.Report) {
	// --- wire reporters here ---
	w.reportCycle(ctx, rep)
	// Package initialisation (client-go's API scheme above all) touched
	// much of the binary once: after the first cycle those file pages
	// leave the RSS; what later cycles run comes back from the page cache.
	w.initPages.Do(func() {
		n, err := memlimit.DropInitPages()
		w.log.Debug("dropped the binary's init-only pages", zap.Int64("advisedBytes", n), zap.Error(err))
	})
}

// OnReloadError reports a rejected policy reload beyond the log and metric.
func (w *wiring) OnReloadError(ctx context.Context, err error) {
	// --- wire reload error reporting here ---
	w.reportReloadError(ctx, err)
}

// Close releases adapters.
func (w *wiring) Close() {
	for i := len(w.closers) - 1; i >= 0; i-- {
		w.closers[i]()
	}
}

// warnPIDNamespace says once at start (and on reload) when --proc-root is
// not this process's PID namespace: every KillProcess then refuses with that
// reason, and --once shows it in its decisions.
func warnPIDNamespace(log *zap.Logger, p procs.Interface) {
	if err := p.CheckPIDNamespace(); err != nil {
		log.Warn("processes will be reported but never signalled", zap.Error(err))
	}
}
