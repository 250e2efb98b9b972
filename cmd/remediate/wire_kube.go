package main

import (
	"context"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// syncWait bounds the wait for the initial cluster view at start.
// Cluster-wide settings come from the policy's `cluster` section (read
// once, at start); the namespace defaults to $POD_NAMESPACE, else the
// pod's service account namespace, else kube-system (kube.Namespace).
const syncWait = 15 * time.Second

// kubeWiring is the Kubernetes side of the daemon, built once on first use
// and shared across policy reloads.
type kubeWiring struct {
	once     sync.Once
	noAccess string // why there is no cluster access, if there is none
	client   *kube.Client
	view     *kube.View
	nodes    *kube.NodeWatch
	pods     *kube.PodWatch      // this node's pods (field selector spec.nodeName)
	events   *kube.SandboxEvents // the sandbox Events of this node's stuck pods
	reporter *kubeexporter.Reporter
	storm    *guardrails.Storm
	budget   *guardrails.Budget
	// publish runs reportCycle's and reportReloadError's writes off the
	// cycle loop.
	publish publisher
	// Fleet controls: the cluster-wide pause and kube-proxy's rollout.
	pause   atomic.Pointer[guardrails.FleetPause]
	rollout *guardrails.KubeProxyRollout
}

// kubeProxyNamespace/kubeProxyDaemonSet is where kube-proxy's DaemonSet is
// looked for (kubeadm's and most distributions' name).
const kubeProxyNamespace, kubeProxyDaemonSet = "kube-system", "kube-proxy"

// fleetPaused is remediate_fleet_paused: 1 while the fleet ConfigMap
// pauses all actions.
func (w *wiring) fleetPaused() float64 {
	if p, _ := w.k.pause.Load().Paused(); p {
		return 1
	}
	return 0
}

// kube connects (once): client, the Services/EndpointSlices view, the watch
// on this Node, the reporter and the cluster guardrails. Without access it
// records why; API-dependent rules then skip or block with that reason.
func (w *wiring) kube() *kubeWiring {
	k := &w.k
	k.once.Do(func() {
		cl := w.pol.Cluster
		// Informers stream their initial lists (client-go's
		// WatchListClient gate, on unless the environment says
		// otherwise); set before client-go reads any gate.
		kube.EnableStreamingList()
		c, err := kube.Connect(kube.Options{Kubeconfig: w.o.kubeconfig})
		if err != nil {
			k.noAccess = err.Error()
			w.log.Info("API-dependent checks and actions are off", zap.String("reason", k.noAccess))
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		w.closers = append(w.closers, cancel)
		ns := cl.Namespace
		if ns == "" {
			var from kube.NamespaceSource
			ns, from = kube.Namespace(os.Getenv("POD_NAMESPACE"), kube.ServiceAccountNamespaceFile)
			// Said at info only when it is not the chart's POD_NAMESPACE nor
			// the default (a one-shot run stays one line when nothing is wrong).
			lvl := zap.DebugLevel
			if from == kube.NamespaceFromServiceAccount {
				lvl = zap.InfoLevel
			}
			w.log.Log(lvl, "namespace of the daemon's Leases and fleet ConfigMap", zap.String("namespace", ns), zap.String("from", string(from)))
		}
		k.client = c
		// The view's memory budget and maximum age (validated by the
		// command line; a negative max age would mean "never").
		mem, _ := viewBudget(w.o.viewMemory)
		maxAge := w.o.viewMaxAge
		if maxAge == 0 {
			maxAge = -1 // 0 on the command line: a disconnected view is not used
		}
		limits := kube.ViewLimits{MemoryBudget: mem, BudgetName: "memory budget (--cluster-view-memory " + w.o.viewMemory + ")", MaxAge: maxAge}
		if k.view, err = kube.NewLimitedView(c.Interface, c.Contact, nil, w.log, limits); err != nil {
			k.noAccess = "cluster view: " + err.Error()
			k.client = nil
			return
		}
		k.view.Start(ctx)
		k.nodes = kube.NewNodeWatch(c.Interface, w.o.nodeName)
		k.nodes.Start(ctx)
		// This node's pods only (spec.nodeName field selector, as the
		// kubelet watches them): PodsNetworkNotReady, CNIAgentUnhealthy.
		if pw, err := kube.NewPodWatch(c.Interface, w.o.nodeName, c.Contact, w.log); err != nil {
			w.log.Warn("no watch of this node's pods: pod checks skip", zap.Error(err))
		} else {
			k.pods = pw
			pw.Start(ctx)
		}
		// The kubelet's sandbox Events of a stuck pod, read on demand by
		// PodsNetworkNotReady (one field-selected LIST per pod, no watch).
		k.events = kube.NewSandboxEvents(c.Interface, w.o.nodeName, 0)
		// The fleet controls: not yet listed means unknown, and unknown
		// allows (a node without the API keeps healing), so they are
		// waited for with the rest: a daemon (re)started during a fleet
		// pause, as in an upgrade, must not act in its first cycles.
		pw := kube.NewFleetPauseWatch(c.Interface, ns)
		pw.Start(ctx)
		dw := kube.NewDaemonSetWatch(c.Interface, kubeProxyNamespace, kubeProxyDaemonSet)
		dw.Start(ctx)
		if err := probeAPIServer(ctx, c); err != nil {
			w.log.Warn("kubernetes API server not answering: API-dependent checks skip and API actions stay blocked until it does (retrying in the background)", zap.Error(err))
		} else {
			sctx, scancel := context.WithTimeout(ctx, syncWait)
			if !k.view.WaitForSync(sctx) || !k.nodes.WaitForSync(sctx) {
				w.log.Warn("cluster view not synced yet; API-dependent actions stay blocked until it is", zap.Duration("waited", syncWait))
			}
			if k.pods != nil && !k.pods.WaitForSync(sctx) {
				w.log.Warn("the watch of this node's pods has not synced yet; the pod checks skip until it does", zap.Error(k.pods.Freshness().LastError))
			}
			if !pw.WaitForSync(sctx) || !dw.WaitForSync(sctx) {
				w.log.Warn("the fleet controls are not known yet (ConfigMap "+ns+"/"+kube.FleetConfigMap+", DaemonSet "+kubeProxyNamespace+"/"+kubeProxyDaemonSet+
					"): until they are, a fleet pause and a kube-proxy rollout do not hold actions (RBAC: the Roles remediate-fleet and remediate-kube-proxy-rollout)",
					zap.Duration("waited", syncWait))
			}
			scancel()
		}
		k.pause.Store(guardrails.NewFleetPause(pw, ns))
		k.rollout = guardrails.NewKubeProxyRollout(dw)
		k.budget = guardrails.NewBudget(c.Interface, guardrails.BudgetOptions{Namespace: ns, Slots: cl.BudgetSlots, TTL: cl.BudgetTTL.Duration, Node: w.o.nodeName, Log: w.log})
		go k.budget.Run(ctx)
		k.storm = guardrails.NewStorm(c.Interface, guardrails.StormOptions{Namespace: ns, Node: w.o.nodeName, MaxShare: cl.StormMaxShare, MinNodes: cl.StormMinNodes})
		k.publish.start(ctx, w.log)
		k.reporter = kubeexporter.New(c.Interface, kubeexporter.Options{Node: w.o.nodeName, Firing: k.storm.Publish, Nodes: k.nodes, Log: w.log})
		// At shutdown, the Event series counts not yet written (they are
		// written every 5 minutes); before the context's cancel (closers
		// run last first).
		w.closers = append(w.closers, func() {
			fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer fcancel()
			if err := k.reporter.Flush(fctx); err != nil {
				w.log.Warn("writing the pending Event series counts at shutdown failed", zap.Error(err))
			}
		})
	})
	return k
}

// Guardrails returns the cluster guardrails, built here and nowhere else
// (guardrails.Cluster: one named field each; guardrails.Chain puts them
// in order). Without cluster access only API freshness (it blocks what
// needs the API, saying why) and the budget (it blocks disruptive actions)
// are in the chain.
func (w *wiring) Guardrails() guardrails.Cluster {
	k := w.kube()
	if k.client == nil {
		return guardrails.Cluster{Freshness: guardrails.NewFreshness(nil, k.noAccess), Budget: guardrails.NewBudget(nil, guardrails.BudgetOptions{})}
	}
	return guardrails.Cluster{
		OptOut:           guardrails.NewOptOut(k.nodes),
		Freshness:        guardrails.NewFreshness(k.view, ""),
		Storm:            k.storm,
		FleetPause:       k.pause.Load(),
		KubeProxyRollout: k.rollout,
		Budget:           k.budget,
	}
}

// reportTimeout bounds one publication of a cycle's report.
const reportTimeout = 20 * time.Second

// reportCycle hands a daemon cycle's report to the publisher (events, the
// node condition, the firing rules for the storm guard, remediate's own
// uncordon) and returns at once: the cycles, and the node-local checks
// and actions in them, never wait on the API server. One publication runs
// at a time; a report that arrives while one runs replaces the one waiting
// (the newest cycle is what the cluster should see).
func (w *wiring) reportCycle(ctx context.Context, rep *remediate.Report) {
	k := w.kube()
	if k.reporter == nil {
		return
	}
	k.publish.hand(func(pctx context.Context) {
		rctx, cancel := context.WithTimeout(pctx, reportTimeout)
		defer cancel()
		if err := k.reporter.Report(rctx, rep); err != nil {
			w.log.Warn("publishing the report to the cluster failed (retried next cycle)", zap.Error(err))
		}
	}, false)
}

// reportReloadError puts a rejected policy reload on the Node as a Warning
// event, in the background as reportCycle.
func (w *wiring) reportReloadError(ctx context.Context, err error) {
	k := w.kube()
	if k.reporter == nil {
		return
	}
	k.publish.hand(func(pctx context.Context) {
		rctx, cancel := context.WithTimeout(pctx, 10*time.Second)
		defer cancel()
		if e := k.reporter.Emit(rctx, "policy-reload|"+err.Error(), "Warning", "PolicyReloadFailed", "ReloadPolicy",
			"invalid policy, keeping the previous one: "+err.Error()); e != nil {
			w.log.Warn("reporting the reload error to the cluster failed", zap.Error(e))
		}
	}, true)
}

// publisher runs the daemon's writes to the cluster one at a time, off the
// cycle loop: at most one cycle report waits (the newest), and a few
// reload errors. Skipped reports are counted in the log at debug level.
type publisher struct {
	mu      sync.Mutex
	ctx     context.Context
	report  func(context.Context)   // the newest cycle report waiting
	others  []func(context.Context) // reload errors waiting (at most 4)
	running bool
	skipped int
	log     *zap.Logger
}

// start binds the publisher to ctx: work handed after ctx ends is dropped.
func (p *publisher) start(ctx context.Context, log *zap.Logger) {
	p.mu.Lock()
	p.ctx, p.log = ctx, log
	p.mu.Unlock()
}

// hand queues fn (a cycle report replaces the waiting one; other work
// waits beside it) and starts the worker if none runs.
func (p *publisher) hand(fn func(context.Context), other bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx == nil || p.ctx.Err() != nil {
		return
	}
	switch {
	case other && len(p.others) < 4:
		p.others = append(p.others, fn)
	case other:
		return
	default:
		if p.report != nil {
			p.skipped++
		}
		p.report = fn
	}
	if !p.running {
		p.running = true
		go p.run()
	}
}

func (p *publisher) run() {
	for {
		p.mu.Lock()
		var fn func(context.Context)
		switch {
		case len(p.others) > 0:
			fn, p.others = p.others[0], p.others[1:]
		case p.report != nil:
			fn, p.report = p.report, nil
		}
		if fn == nil || p.ctx.Err() != nil {
			p.running, p.report, p.others = false, nil, nil
			if p.skipped > 0 {
				p.log.Debug("cycle reports replaced by newer ones while the API server was slow", zap.Int("skipped", p.skipped))
				p.skipped = 0
			}
			p.mu.Unlock()
			return
		}
		ctx := p.ctx
		p.mu.Unlock()
		fn(ctx)
	}
}
