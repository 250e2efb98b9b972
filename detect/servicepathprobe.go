package detect

import (
	"context"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/probe"
	"github.com/remediate-dev/remediate/policy"
)

// ServicePathProbeName is the registered type name.
const ServicePathProbeName = "ServicePathProbe"

// Bounds of ServicePathProbe's parameters.
const (
	spMaxCanaries   = 16
	spMaxConnects   = 16
	spConfirmPause  = time.Second
	spKubernetesNS  = "default"
	spKubernetesSvc = "kubernetes"
)

// ServicePathProbeParams configure ServicePathProbe.
//
// Cost: a path that answers costs one connect per run; a failing one costs
// up to `failures` Service connects (1 s apart) plus one direct connect per
// ready endpoint, all within maxConnects. The `kubernetes` probe is a TCP
// handshake to the API server without TLS: each one adds to the API
// server's apiserver_tls_handshake_errors_total (logged only at -v=5).
type ServicePathProbeParams struct {
	// Kubernetes probes the `kubernetes` Service in `default` (the API
	// server's own; default true).
	Kubernetes bool `yaml:"kubernetes"`
	// Canaries are more Services to probe: "namespace/name" (its first TCP
	// port) or "namespace/name/port" (a port name or number); at most 16.
	Canaries []string `yaml:"canaries"`
	// Families to probe: IPv4, IPv6 (default both). A dual-stack Service is
	// probed once per ClusterIP of these families, each against an
	// endpoint of the same family.
	Families []string `yaml:"families"`
	// MaxConnects bounds the TCP connects of one run, through Services and
	// direct together (default 4; 2 to 16). Probes that do not fit wait
	// for the next run, which starts with them.
	MaxConnects int `yaml:"maxConnects"`
	// ConnectTimeout bounds each connect (default 2s: Linux retransmits a
	// lost SYN after 1 s, so one lost SYN does not fail a connect; 100ms
	// to 10s). Keep maxConnects x connectTimeout + 1s under the policy's
	// detectorTimeout; a connect the detector's deadline would cut is not
	// started.
	ConnectTimeout policy.Duration `yaml:"connectTimeout"`
	// MinPeriod is the shortest time between two probing runs (default
	// 10s); a run sooner repeats the last results without connecting.
	MinPeriod policy.Duration `yaml:"minPeriod"`
	// Failures is how many consecutive Service connects must fail before
	// the path is judged (default 2; 1 to 5). They are made 1 s apart in
	// the same run when the budget allows (so --once judges in one run),
	// else over the next runs.
	Failures int `yaml:"failures"`
}

// SetDefaults sets the defaults (registry.Defaulter).
func (p *ServicePathProbeParams) SetDefaults() {
	*p = ServicePathProbeParams{Kubernetes: true, Families: []string{"IPv4", "IPv6"}, MaxConnects: 4,
		ConnectTimeout: policy.D(2 * time.Second), MinPeriod: policy.D(10 * time.Second), Failures: 2}
}

// Validate implements policy.Validator.
func (p *ServicePathProbeParams) Validate() []policy.FieldError {
	errs := validateFamilies(p.Families)
	if !p.Kubernetes && len(p.Canaries) == 0 {
		errs = append(errs, policy.FieldError{Field: "canaries", Msg: "nothing to probe: list canaries or leave kubernetes on"})
	}
	if len(p.Canaries) > spMaxCanaries {
		errs = append(errs, policy.FieldError{Field: "canaries", Msg: fmt.Sprintf("at most %d", spMaxCanaries)})
	}
	seen := map[probe.Spec]bool{}
	for i, c := range p.Canaries {
		s, err := probe.ParseCanary(c)
		if err != nil {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("canaries[%d]", i), Msg: err.Error()})
			continue
		}
		if seen[s] {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("canaries[%d]", i), Msg: fmt.Sprintf("%q is listed twice", c)})
		}
		seen[s] = true
	}
	if p.MaxConnects < 2 || p.MaxConnects > spMaxConnects {
		errs = append(errs, policy.FieldError{Field: "maxConnects", Msg: fmt.Sprintf("must be in [2, %d] (a failing path needs a Service and a direct connect)", spMaxConnects)})
	}
	if p.ConnectTimeout.Duration < 100*time.Millisecond || p.ConnectTimeout.Duration > 10*time.Second {
		errs = append(errs, policy.FieldError{Field: "connectTimeout", Msg: "must be in [100ms, 10s]"})
	}
	if p.MinPeriod.Duration < time.Second || p.MinPeriod.Duration > time.Hour {
		errs = append(errs, policy.FieldError{Field: "minPeriod", Msg: "must be in [1s, 1h]"})
	}
	if p.Failures < 1 || p.Failures > 5 {
		errs = append(errs, policy.FieldError{Field: "failures", Msg: "must be in [1, 5]"})
	}
	return errs
}

func init() {
	Define(ServicePathProbeName,
		"TCP connect (no payload) through the `kubernetes` Service and configured canary Services, compared with a direct connect to their ready endpoints: the Service path failing while its backend answers is the dataplane's fault; both failing is a backend problem",
		newServicePathProbe, Targets(finding.KindServicePath), UsesClusterView())
}

// spState is what the detector remembers of one path between runs.
type spState struct {
	// fails counts consecutive failing Service connects.
	fails int
	// last is the last judged finding, reported again while the path is
	// not probed (budget, minPeriod) until a connect answers.
	last    *finding.Finding
	lastRun time.Time
}

type servicePath struct {
	judgement
	p     ServicePathProbeParams
	n     *node.Node
	specs []probe.Spec
	// pause waits between confirming connects (a test replaces it).
	pause func(ctx context.Context, d time.Duration) error

	mu         sync.Mutex
	lastRun    time.Time
	lastJudged string
	next       probe.Ref // the path the next run starts with
	state      map[probe.Ref]*spState
}

func newServicePathProbe(p *ServicePathProbeParams, n *node.Node) (Detector, error) {
	d := &servicePath{p: *p, n: n, state: map[probe.Ref]*spState{}, pause: sleepCtx}
	if p.Kubernetes {
		d.specs = append(d.specs, probe.Spec{Namespace: spKubernetesNS, Name: spKubernetesSvc})
	}
	for _, c := range p.Canaries {
		s, err := probe.ParseCanary(c)
		if err != nil {
			return nil, err
		}
		d.specs = append(d.specs, s)
	}
	return d, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// spVerdict is how a judged path ended.
type spVerdict string

const (
	spDataplane spVerdict = "dataplane"
	spPartial   spVerdict = "dataplane-partial"
	spBackend   spVerdict = "backend"
)

// spResultEvidence is one connect in a finding's evidence.
type spResultEvidence struct {
	Addr      string  `json:"addr"`
	Outcome   string  `json:"outcome"`
	LatencyMs float64 `json:"latencyMs"`
	Error     string  `json:"error,omitempty"`
}

func spEvidence(r probe.Result) spResultEvidence {
	e := spResultEvidence{Addr: r.Addr.String(), Outcome: string(r.Outcome), LatencyMs: float64(r.Latency.Microseconds()) / 1000}
	if r.Err != nil && r.Outcome != probe.Timeout {
		e.Error = r.Err.Error()
	}
	return e
}

// judgeServicePath turns a failing Service path and its direct connects
// into a finding. Pure.
func judgeServicePath(path probe.Path, svc probe.Result, fails int, direct []probe.Result) finding.Finding {
	var ok, bad []string
	for _, r := range direct {
		if r.OK() {
			ok = append(ok, fmt.Sprintf("%s %s", r.Addr, r))
		} else {
			bad = append(bad, fmt.Sprintf("%s %s", r.Addr, r))
		}
	}
	svcName := path.Ref.Service()
	head := fmt.Sprintf("%s port %d (%s ClusterIP %s) fails through the Service: %s, %d consecutive connects",
		svcName, path.Ref.Port, path.Ref.Family, path.VIP, svc, fails)
	var verdict spVerdict
	var sev finding.Severity
	var msg string
	switch {
	case len(bad) > 0:
		verdict, sev = spBackend, finding.Warning
		what := "its backend fails directly too"
		if len(direct) > 1 {
			what = fmt.Sprintf("%d of %d backends checked fail directly too", len(bad), len(direct))
		}
		msg = fmt.Sprintf("%s; %s (%s): a backend problem, not the Service dataplane", head, what, strings.Join(bad, "; "))
		if len(ok) > 0 {
			msg += fmt.Sprintf(" (answering: %s)", strings.Join(ok, "; "))
		}
	case len(direct) < len(path.Backends):
		verdict, sev = spPartial, finding.Warning
		msg = fmt.Sprintf("%s, while the %d of %d backends checked answer directly (%s); the others wait for the connect budget",
			head, len(direct), len(path.Backends), strings.Join(ok, "; "))
	default:
		verdict, sev = spDataplane, finding.Critical
		who := "its backend answers"
		if len(direct) > 1 {
			who = fmt.Sprintf("all %d backends answer", len(direct))
		}
		msg = fmt.Sprintf("%s, while %s directly (%s): the Service path on this node drops or rejects what its backends accept (a firewall or filter rule after kube-proxy's DNAT, a CNI policy, conntrack)",
			head, who, strings.Join(ok, "; "))
	}
	checked := make([]spResultEvidence, 0, len(direct))
	for _, r := range direct {
		checked = append(checked, spEvidence(r))
	}
	return finding.Finding{
		Detector: ServicePathProbeName,
		Target:   path.Ref.Target(),
		Severity: sev,
		Message:  msg,
		Evidence: map[string]any{
			"service":             svcName,
			"family":              path.Ref.Family,
			"port":                int(path.Ref.Port),
			"portName":            path.PortName,
			"clusterIP":           path.VIP.String(),
			"verdict":             string(verdict),
			"serviceResult":       spEvidence(svc),
			"consecutiveFailures": fails,
			"backendsChecked":     checked,
			"backendsUsable":      len(path.Backends),
		},
	}
}

// Detect probes the paths in turn, starting where the last run stopped,
// within the connect budget: a Service connect each; a failing one is
// confirmed by further Service connects, then compared with direct
// connects to its backends.
func (d *servicePath) Detect(ctx context.Context) ([]finding.Finding, error) {
	n := d.n
	d.set("")
	if n.Probe == nil {
		return nil, finding.Skip("%s", n.Why("probe"))
	}
	if err := clusterViewGate(n, "no ClusterIP or endpoint to probe"); err != nil {
		return nil, err
	}
	now := n.Clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.lastRun.IsZero() && now.Sub(d.lastRun) < d.p.MinPeriod.Duration {
		d.set("%s (probed %s ago; not again within minPeriod %s)", d.lastJudged, now.Sub(d.lastRun).Round(time.Second), d.p.MinPeriod.Duration)
		return d.lastFindings(now), nil
	}
	paths, not := probe.Plan(n.Cluster, d.specs, d.p.Families, n.Name)
	if len(paths) == 0 {
		d.state = map[probe.Ref]*spState{}
		return nil, finding.Skip("no Service path to probe: %s", strings.Join(not, "; "))
	}
	d.lastRun = now
	live := map[probe.Ref]bool{}
	start := 0
	for i, p := range paths {
		live[p.Ref] = true
		if p.Ref == d.next {
			start = i
		}
		if d.state[p.Ref] == nil {
			d.state[p.Ref] = &spState{}
		}
	}
	for ref := range d.state {
		if !live[ref] {
			delete(d.state, ref)
		}
	}
	timeout := d.p.ConnectTimeout.Duration
	budget := d.p.MaxConnects
	var stopped string
	connect := func(a netip.AddrPort) (probe.Result, bool) {
		if budget < 1 {
			stopped = "connect budget"
			return probe.Result{}, false
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < timeout {
			stopped = "the detector's deadline"
			return probe.Result{}, false
		}
		budget--
		r := n.Probe.Connect(ctx, a, timeout)
		if r.Outcome == probe.Aborted {
			stopped = "the detector's deadline"
			return r, false
		}
		return r, true
	}
	var answered []string
	var recovered []string
	done := 0
	d.next = probe.Ref{}
	for k := 0; k < len(paths); k++ {
		path := paths[(start+k)%len(paths)]
		st := d.state[path.Ref]
		svc, ok := connect(path.VIP)
		if !ok {
			d.next = path.Ref
			break
		}
		for !svc.OK() {
			st.fails++
			// Confirm while the budget keeps room for a direct connect.
			if st.fails >= d.p.Failures || budget < 2 {
				break
			}
			if d.pause(ctx, spConfirmPause) != nil {
				stopped, ok = "the detector's deadline", false
				break
			}
			if svc, ok = connect(path.VIP); !ok {
				break
			}
		}
		if !ok {
			d.next = path.Ref
			break
		}
		if svc.OK() {
			if st.fails > 0 {
				recovered = append(recovered, fmt.Sprintf("%s answered after %d failed connect(s)", path.Ref.Service(), st.fails))
			}
			st.fails, st.last, st.lastRun = 0, nil, now
			answered = append(answered, fmt.Sprintf("%s %s %s", path.Ref.Service(), path.VIP, svc))
			done++
			continue
		}
		if st.fails < d.p.Failures {
			// Not confirmed yet: the next run starts here.
			stopped = "connect budget"
			d.next = path.Ref
			break
		}
		var direct []probe.Result
		for _, b := range path.Backends {
			r, ok := connect(b)
			if !ok {
				break
			}
			direct = append(direct, r)
		}
		if len(direct) == 0 {
			d.next = path.Ref
			break
		}
		f := judgeServicePath(path, svc, st.fails, direct)
		st.last, st.lastRun = &f, now
		done++
	}
	out := d.lastFindings(now)
	judged := fmt.Sprintf("%d of %d Service paths answer", len(answered), len(paths))
	if len(answered) > 0 {
		judged += " (" + strings.Join(answered, "; ") + ")"
	}
	if done < len(paths) {
		judged += fmt.Sprintf("; %d wait for the next run (%s)", len(paths)-done, stopped)
	}
	if len(recovered) > 0 {
		judged += "; " + strings.Join(recovered, "; ")
	}
	if len(not) > 0 {
		judged += "; not probed: " + strings.Join(not, "; ")
	}
	d.lastJudged = judged
	d.set("%s", judged)
	return out, nil
}

// lastFindings returns the judged findings still standing, by target; one
// judged before now says how long ago (probedAgo).
func (d *servicePath) lastFindings(now time.Time) []finding.Finding {
	var out []finding.Finding
	for _, st := range d.state {
		if st.last == nil {
			continue
		}
		f := *st.last
		ev := make(map[string]any, len(f.Evidence)+1)
		for k, v := range f.Evidence {
			ev[k] = v
		}
		if st.lastRun.Before(now) {
			ev["probedAgo"] = now.Sub(st.lastRun).Round(time.Second).String()
		}
		f.Evidence = ev
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Target < out[j].Target })
	return out
}
