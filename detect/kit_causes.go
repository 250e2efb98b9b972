package detect

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/cpustat"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procident"
	"github.com/remediate-dev/remediate/internal/procs"
)

// This file gathers, for the kube-proxy symptom detectors (slow sync, stale
// sync, growing pending changes) and XtablesLockContention, the
// observations behind the likely causes of their findings, and attaches
// the ranked causes (internal/causes) to the findings' evidence.

// causeWindowMin is the shortest window causes are judged over: a churn or
// throttling rate over less than this is noise.
const causeWindowMin = 30 * time.Second

// cpuSampleMin is the least time between two CPU samples.
const cpuSampleMin = time.Second

// podCIDRTTL is how long the Node's podCIDRs are reused.
const podCIDRTTL = 5 * time.Minute

// causeWatch keeps one detector's observations. observe runs every cycle
// and is cheap: the churn counter comes with the scrape the detector
// already has, /proc/stat is one small read, kube-proxy's cpu.stat two once
// its process is known. attach runs only when the detector has findings:
// it then finds kube-proxy's process (once), and reads the lock, the last
// saves (never a save of its own), /configz and the Node.
type causeWatch struct {
	mu      sync.Mutex
	lastSeq uint64
	seq     uint64 // local sample counter for the CPU windows
	churn   window[float64]
	cpu     window[cpustat.CgroupCPU]
	node    window[cpustat.CPUTimes]
	// kp is kube-proxy's process once found (nil before, or when it
	// could not be told apart).
	kp       *procs.Process
	podCIDRs []netip.Prefix
	podErr   error
	podAt    time.Time
}

// observe records this cycle's cheap samples (sc may be nil: no scrape).
// span is how far back the windows reach.
func (w *causeWatch) observe(ctx context.Context, n *node.Node, sc *kubeproxy.Scrape, span time.Duration) {
	span = max(span, causeWindowMin)
	w.mu.Lock()
	defer w.mu.Unlock()
	if sc != nil && sc.Seq != w.lastSeq { // a scrape seen again adds nothing
		w.lastSeq = sc.Seq
		if v := sc.Metrics.EndpointChangesTotal; v != nil {
			w.churn.add(sc.Seq, sc.At, *v, span)
			if o, nw, ok := w.churn.ends(); ok && nw.v < o.v {
				w.churn.reset() // kube-proxy restarted
			}
		}
	}
	if n.CPU == nil {
		return
	}
	now := n.Clock.Now()
	if last, ok := lastOf(w.node); ok && now.Sub(last.at) < cpuSampleMin {
		return // sampled moments ago (a detector run twice in a cycle)
	}
	w.seq++
	if t, err := n.CPU.NodeCPU(ctx); err == nil {
		w.node.add(w.seq, now, t, span)
	}
	if w.kp != nil && w.sampleCPU(ctx, n, now, span) != nil {
		w.kp, w.cpu = nil, window[cpustat.CgroupCPU]{} // gone or moved: find it again when needed
	}
}

// sampleCPU adds a sample of kube-proxy's cgroup; the caller holds mu.
func (w *causeWatch) sampleCPU(ctx context.Context, n *node.Node, now time.Time, span time.Duration) error {
	c, err := n.CPU.CgroupCPU(ctx, w.kp.Pid)
	if err != nil {
		return err
	}
	if _, last, ok := w.cpu.ends(); ok && last.v.Path != c.Path {
		w.cpu = window[cpustat.CgroupCPU]{}
	}
	w.cpu.add(w.seq, now, c, span)
	if o, nw, ok := w.cpu.ends(); ok {
		if _, ok := nw.v.Sub(o.v); !ok {
			w.cpu.reset()
		}
	}
	return nil
}

// attach ranks the causes for each finding's IP family (Unlabelled: all)
// and puts them in the findings' evidence.
func (w *causeWatch) attach(ctx context.Context, n *node.Node, sc *kubeproxy.Scrape, fam func(finding.Finding) kubeproxy.Family, span time.Duration, out []finding.Finding) {
	if len(out) == 0 {
		return
	}
	span = max(span, causeWindowMin)
	done := map[kubeproxy.Family]struct {
		r   causes.Result
		why []string
	}{}
	for i := range out {
		f := fam(out[i])
		res, ok := done[f]
		if !ok {
			res.r, res.why = w.rank(ctx, n, sc, f, span)
			done[f] = res
		}
		if out[i].Evidence == nil {
			out[i].Evidence = map[string]any{}
		}
		res.r.Attach(out[i].Evidence, res.why)
	}
}

// rank gathers the inputs and ranks them; notObserved says why a cause
// could not be judged.
func (w *causeWatch) rank(ctx context.Context, n *node.Node, sc *kubeproxy.Scrape, fam kubeproxy.Family, span time.Duration) (causes.Result, []string) {
	var in causes.Inputs
	var why []string
	w.mu.Lock()
	// Churn.
	switch {
	case sc == nil:
		why = append(why, "endpoint churn: kube-proxy's metrics not read")
	case sc.Metrics.EndpointChangesTotal == nil:
		why = append(why, "endpoint churn: kube-proxy exports no sync_proxy_rules_endpoint_changes_total")
	default:
		if o, nw, ok := w.churn.ends(); ok && nw.at.Sub(o.at) > 0 {
			in.Churn = &causes.Churn{Changes: nw.v - o.v, Window: nw.at.Sub(o.at)}
		} else {
			why = append(why, "endpoint churn: one scrape so far")
		}
	}
	// Throttling and softirq.
	if n.CPU == nil {
		why = append(why, "CPU throttling and softirq: "+n.Why("cpustat"))
	} else {
		if t, err := w.throttling(ctx, n, span); err != nil {
			why = append(why, "kube-proxy CPU throttling: "+err.Error())
		} else {
			in.Throttling = t
		}
		if o, nw, ok := w.node.ends(); ok {
			if s, ok := nw.v.SoftIRQShare(o.v); ok {
				in.SoftIRQ = &causes.SoftIRQStat{Share: s, Window: nw.at.Sub(o.at)}
			}
		}
		if in.SoftIRQ == nil {
			why = append(why, "node softirq: one /proc/stat sample so far")
		}
	}
	kpProc := w.kp
	w.mu.Unlock()

	in.Rules = ruleSets(n, sc, fam)
	if l, err := lockWindow(ctx, n, kpProc, span); err != nil {
		why = append(why, "xtables lock holders: "+err.Error())
	} else {
		in.Lock = l
	}
	if c, podErr, err := w.config(ctx, n, sc); err != nil {
		why = append(why, "kube-proxy configuration: "+err.Error())
	} else {
		in.Config = c
		if podErr != nil {
			why = append(why, "clusterCIDR vs the Node's podCIDR: "+podErr.Error())
		}
	}
	logs, logWhy := logCauses(ctx, n, span)
	in.Logs = logs
	why = append(why, logWhy...)
	return causes.Rank(in), why
}

// throttling returns kube-proxy's throttling over the window (or since its
// cgroup started, on the first sample). The caller holds mu.
func (w *causeWatch) throttling(ctx context.Context, n *node.Node, span time.Duration) (*causes.Throttling, error) {
	if w.kp == nil {
		p, _, err := findKubeProxy(ctx, n)
		if err != nil {
			return nil, err
		}
		w.kp = &p
		w.cpu = window[cpustat.CgroupCPU]{}
	}
	if len(w.cpu.samples) == 0 {
		w.seq++
		if err := w.sampleCPU(ctx, n, n.Clock.Now(), span); err != nil {
			w.kp = nil // look for kube-proxy again next time
			return nil, err
		}
	}
	o, nw, ok := w.cpu.ends()
	if !ok {
		// One sample: the cgroup's totals since it was created.
		c := w.cpu.samples[0].v
		return &causes.Throttling{Periods: c.Periods, Throttled: c.Throttled, ThrottledTime: c.ThrottledTime, Lifetime: true, Cgroup: c.Path}, nil
	}
	d, _ := nw.v.Sub(o.v)
	return &causes.Throttling{Periods: d.Periods, Throttled: d.Throttled, ThrottledTime: d.ThrottledTime,
		Window: nw.at.Sub(o.at), Cgroup: nw.v.Path}, nil
}

// ruleSets returns the rule counts and save times of the family
// (Unlabelled: all): from the last saves of the shared iptables adapter
// when it has any, else kube-proxy's own rule counts.
func ruleSets(n *node.Node, sc *kubeproxy.Scrape, fam kubeproxy.Family) []causes.RuleSet {
	var out []causes.RuleSet
	if ls, ok := n.IPTables.(iptables.LastSnapshotter); ok && n.IPTables != nil {
		for _, s := range ls.LastSnapshots() {
			if fam != kubeproxy.Unlabelled && string(s.Family) != string(fam) {
				continue
			}
			out = append(out, causes.RuleSet{Family: string(s.Family), Backend: string(s.Backend), Table: "nat",
				Rules: s.RuleCount("nat"), Save: s.Duration})
			out = append(out, causes.RuleSet{Family: string(s.Family), Backend: string(s.Backend), Table: "filter",
				Rules: s.RuleCount("filter")})
		}
	}
	if len(out) > 0 || sc == nil {
		return out
	}
	for _, f := range sc.Metrics.FamilyNames() {
		if fam != kubeproxy.Unlabelled && f != fam {
			continue
		}
		fm := sc.Metrics.Families[f]
		tables := make([]string, 0, len(fm.RulesTotal))
		for t := range fm.RulesTotal {
			tables = append(tables, t)
		}
		sort.Strings(tables)
		for _, t := range tables {
			out = append(out, causes.RuleSet{Family: string(f), Table: t, Rules: int(min(fm.RulesTotal[t], 1e9))})
		}
	}
	return out
}

// lockWindow returns the lock holds of the window from the hold history,
// else the current /proc/locks snapshot.
func lockWindow(ctx context.Context, n *node.Node, kp *procs.Process, span time.Duration) (*causes.LockWindow, error) {
	if n.LockHistory != nil {
		return n.LockHistory.LockWindow(ctx, span)
	}
	if n.Procs == nil {
		return nil, errors.New(n.Why("procs"))
	}
	if n.XtablesLock == "" {
		return nil, errors.New("no xtables lock file configured")
	}
	l, err := n.Procs.FileLocks(ctx, n.XtablesLock)
	if errors.Is(err, fs.ErrNotExist) {
		return &causes.LockWindow{}, nil // never taken: free
	}
	if err != nil {
		return nil, err
	}
	out := &causes.LockWindow{Waiters: len(l.Waiters)}
	for _, h := range l.Holders {
		// kube-proxy's own or its child (its iptables-restore), by what
		// the holder cannot choose when kube-proxy's process is known: its
		// parent, or kube-proxy's pod's cgroup; by name otherwise.
		isKP := slices.Contains(procident.ProxyPrograms, h.Name()) || slices.Contains(procident.ProxyPrograms, h.ParentName)
		if kp != nil {
			isKP = procident.OwnProcess(h, *kp)
		}
		out.Holders = append(out.Holders, causes.LockHolder{Program: h.Name(), PID: h.Pid, KubeProxy: isKP, Holds: 1})
	}
	return out, nil
}

// config reads kube-proxy's /configz and the Node's podCIDRs (podErr: why
// the podCIDRs are not known).
func (w *causeWatch) config(ctx context.Context, n *node.Node, sc *kubeproxy.Scrape) (c *causes.Config, podErr, err error) {
	cr, ok := n.KubeProxy.(kubeproxy.ConfigReader)
	if !ok || n.KubeProxy == nil {
		return nil, nil, errors.New("kube-proxy's /configz is not read here")
	}
	cz, err := cr.Configz(ctx)
	if err != nil {
		return nil, nil, err
	}
	c = &causes.Config{MinSyncPeriod: cz.MinSyncPeriod}
	for _, s := range strings.Split(cz.ClusterCIDR, ",") {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil {
			c.ClusterCIDRs = append(c.ClusterCIDRs, p.Masked())
		}
	}
	if sc != nil {
		if m, ok := sc.Metrics.MinorVersion(); ok {
			c.Version, c.AtLeast128 = fmt.Sprintf("1.%d", m), m >= 28
		} else if sc.Metrics.Labelled {
			c.Version, c.AtLeast128 = "1.33+", true // ip_family labels came with 1.33
		}
	}
	if len(c.ClusterCIDRs) > 0 {
		c.NodePodCIDRs, podErr = w.nodePodCIDRs(ctx, n)
	}
	return c, podErr, nil
}

// nodePodCIDRs returns the Node's podCIDRs (cached for podCIDRTTL, a
// failure too, so a refused GET is not repeated every cycle).
func (w *causeWatch) nodePodCIDRs(ctx context.Context, n *node.Node) ([]netip.Prefix, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := n.Clock.Now()
	if !w.podAt.IsZero() && now.Sub(w.podAt) < podCIDRTTL {
		return w.podCIDRs, w.podErr
	}
	if n.Kube == nil || n.Name == "" {
		return nil, errors.New(n.Why("kubernetes"))
	}
	gctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var out []netip.Prefix
	nd, err := n.Kube.CoreV1().Nodes().Get(gctx, n.Name, metav1.GetOptions{})
	if err == nil {
		cidrs := nd.Spec.PodCIDRs
		if len(cidrs) == 0 && nd.Spec.PodCIDR != "" {
			cidrs = []string{nd.Spec.PodCIDR}
		}
		for _, s := range cidrs {
			if p, perr := netip.ParsePrefix(s); perr == nil && len(out) < 4 {
				out = append(out, p.Masked())
			}
		}
		if len(out) == 0 {
			err = fmt.Errorf("node %s has no podCIDR", n.Name)
		}
	} else {
		err = fmt.Errorf("reading node %s: %w", n.Name, err)
	}
	w.podCIDRs, w.podErr, w.podAt = out, err, now
	return out, err
}

// familyOfTarget is the IP family a kube-proxy finding is about.
func familyOfTarget(f finding.Finding) kubeproxy.Family {
	fam, err := kubeproxy.FamilyFromTarget(f.Target)
	if err != nil {
		return kubeproxy.Unlabelled
	}
	return fam
}
