package detect

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/hostlocal"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// HostLocalIPAMParams are the thresholds of HostLocalIPAM.
type HostLocalIPAMParams struct {
	// WarnPercent is the share of a range set's addresses allocated that
	// makes a warning before exhaustion (default 90); all of them
	// allocated is critical.
	WarnPercent int `yaml:"warnPercent"`
	// LeakGrace is how old an allocation of a container ID the runtime
	// does not have must be to count as leaked (default 5m: a sandbox
	// being set up has its address before the runtime lists it).
	LeakGrace policy.Duration `yaml:"leakGrace"`
	// MaxListed bounds the leaked addresses named in a finding (default
	// 10); the count is always complete (within the store's read bounds).
	MaxListed int `yaml:"maxListed"`
}

// SetDefaults sets the defaults of HostLocalIPAM (registry.Defaulter).
func (p *HostLocalIPAMParams) SetDefaults() {
	*p = HostLocalIPAMParams{WarnPercent: 90, LeakGrace: policy.D(5 * time.Minute), MaxListed: 10}
}

// Validate implements policy.Validator.
func (p *HostLocalIPAMParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.WarnPercent < 1 || p.WarnPercent > 100 {
		errs = append(errs, policy.FieldError{Field: "warnPercent", Msg: "must be between 1 and 100"})
	}
	if p.LeakGrace.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "leakGrace", Msg: "must be >= 0"})
	}
	if p.MaxListed < 1 || p.MaxListed > 100 {
		errs = append(errs, policy.FieldError{Field: "maxListed", Msg: "must be between 1 and 100"})
	}
	return errs
}

func init() {
	Define("HostLocalIPAM",
		"host-local IPAM of the CNI configuration in use (--cni-ipam-dir): a range set allocated at warnPercent or more (warning) or full (critical: new pods get no address), and addresses leaked to container IDs the runtime (--cri-socket, ListPodSandbox) does not have; report only",
		newHostLocalIPAM, Targets(finding.KindCNIIPAM))
}

// IPAMTarget is the target of a network's usage finding; its leaked
// addresses' finding adds "/leaked".
func IPAMTarget(network string) string { return "cni-ipam/" + network }

type hostLocalIPAM struct {
	p HostLocalIPAMParams
	n *node.Node
	judgement
	// pods caches the Node's podCIDRs (the ranges of a configuration that
	// leaves them to a wrapper: "usePodCidr", no range).
	pods causeWatch
}

func newHostLocalIPAM(p *HostLocalIPAMParams, n *node.Node) (Detector, error) {
	return &hostLocalIPAM{p: *p, n: n}, nil
}

func (d *hostLocalIPAM) Detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.CNIConfDir == "" {
		return nil, finding.Skip("no CNI configuration directory configured (--cni-conf-dir)")
	}
	// The cycle's one read, shared with CNIConfig: the file in use's
	// bytes come with it.
	dir := readCNI(ctx, d.n)
	f := dir.InUse()
	if dir.ConfDirErr != nil || f == nil || f.Err != "" {
		return nil, finding.Skip("no loadable CNI configuration in %s (CNIConfig reports it)", d.n.CNIConfDir)
	}
	confs, err := hostlocal.ParseConfig(f.Data)
	if err != nil {
		return nil, finding.Skip("CNI configuration %s/%s: %v", dir.ConfDir, f.Name, err)
	}
	if len(confs) == 0 {
		return nil, finding.Skip("network %s (%s/%s) does not use host-local IPAM", f.Network, dir.ConfDir, f.Name)
	}
	if d.n.CNIIPAMDir == "" && confs[0].DataDir == "" {
		return nil, finding.Skip("no host-local data directory configured (--cni-ipam-dir)")
	}
	live, leakSkip := d.sandboxes(ctx)
	now := nowOf(d.n)
	var out []finding.Finding
	var judged []string
	for _, c := range confs {
		c = d.podCIDRFallback(ctx, c)
		fs, j, err := d.network(c, f.Name, live, leakSkip, now)
		if err != nil {
			return out, err
		}
		out = append(out, fs...)
		judged = append(judged, j)
	}
	d.set("%s", strings.Join(judged, "; "))
	return out, nil
}

// podCIDRFallback gives a configuration without a usable range (a subnet
// of "usePodCidr" that a wrapper fills in, or no range at all) the Node's
// podCIDRs, as host-local then gets them; c.Unknown then says where the
// ranges came from, or why they stay unknown.
func (d *hostLocalIPAM) podCIDRFallback(ctx context.Context, c hostlocal.Config) hostlocal.Config {
	if len(c.RangeSets) > 0 || c.Unknown == "" {
		return c
	}
	cidrs, err := d.pods.nodePodCIDRs(ctx, d.n)
	if sets := hostlocal.PodCIDRRangeSets(cidrs); err == nil && len(sets) > 0 {
		c.RangeSets = sets
		c.Unknown += fmt.Sprintf("; the Node's podCIDRs used instead: %v", cidrs)
		return c
	} else if err != nil {
		c.Unknown += "; the Node's podCIDRs not known either: " + err.Error()
	}
	return c
}

// storeDir is where host-local's store of c is read: a configuration's
// own dataDir (a host path) where it exists here, as on the host; else
// --cni-ipam-dir, the store as mounted here (the pod mounts the host's
// store there, whatever its host path). Neither present is a skip, never
// "nothing allocated": a store that is not mounted is not an empty one.
func (d *hostLocalIPAM) storeDir(c hostlocal.Config) (string, error) {
	candidates := []string{d.n.CNIIPAMDir}
	if c.DataDir != "" && c.DataDir != hostlocal.DefaultDataDir {
		candidates = []string{c.DataDir, d.n.CNIIPAMDir}
	}
	var tried []string
	for _, dir := range candidates {
		if dir == "" || slices.Contains(tried, dir) {
			continue
		}
		tried = append(tried, dir)
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir, nil
		}
	}
	return "", finding.Skip("host-local data directory not found here (tried %s): mount the host's store and set --cni-ipam-dir", strings.Join(tried, ", "))
}

// sandboxes is the set of the runtime's sandbox IDs, or why the leak
// check is skipped. The runtime is asked with half of the detector's time
// left: a hung CRI socket (it accepts and never answers) costs the leak
// check only, and the store is still read and judged (exhaustion is
// critical whatever the runtime says).
func (d *hostLocalIPAM) sandboxes(ctx context.Context) (map[string]bool, string) {
	if d.n.CRI == nil {
		return nil, d.n.Why("cri")
	}
	cctx, cancel := halfOfDeadline(ctx)
	defer cancel()
	start := time.Now()
	sbs, err := d.n.CRI.ListPodSandboxes(cctx)
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Sprintf("the runtime did not answer within %s, half of the detector's time (a hung CRI socket?): %v", time.Since(start).Round(time.Millisecond), err)
		}
		return nil, err.Error()
	}
	live := make(map[string]bool, len(sbs))
	for _, s := range sbs {
		live[s.ID] = true
	}
	return live, ""
}

func (d *hostLocalIPAM) network(c hostlocal.Config, file string, live map[string]bool, leakSkip string, now time.Time) ([]finding.Finding, string, error) {
	dataDir, err := d.storeDir(c)
	if err != nil {
		return nil, "", err
	}
	st, err := hostlocal.ReadNetwork(dataDir, c.Network, hostlocal.Limits{})
	if hostlocal.IsNotExist(err) {
		return nil, fmt.Sprintf("network %s: no host-local store in %s yet (nothing allocated)", c.Network, dataDir), nil
	}
	if err != nil {
		return nil, "", err
	}
	ev := map[string]any{"network": c.Network, "config": file, "store": st.Dir, "allocated": len(st.Allocations)}
	if st.Truncated {
		ev["truncated"] = fmt.Sprintf("listing stopped at %d entries: the counts are lower bounds", st.Entries)
	}
	if st.Unread > 0 {
		ev["unread"] = st.Unread
	}
	if len(st.Other) > 0 {
		ev["otherEntries"] = st.Other
	}
	if c.Unknown != "" {
		ev["rangesUnknown"] = c.Unknown
	}
	var out []finding.Finding
	var sets []map[string]any
	worst, worstPct, worstSet := finding.Severity(""), -1.0, ""
	for _, rs := range c.RangeSets {
		n := 0
		for _, a := range st.Allocations {
			if rs.Contains(a.IP) {
				n++
			}
		}
		size := rs.Size()
		pct := 100 * float64(n) / float64(max(size, 1))
		sets = append(sets, map[string]any{"ranges": rs.String(), "size": size, "allocated": n, "percent": round1(pct)})
		sev := finding.Severity("")
		switch {
		case size > 0 && uint64(n) >= size:
			sev = finding.Critical
		case pct >= float64(d.p.WarnPercent):
			sev = finding.Warning
		}
		if pct > worstPct {
			worstPct, worstSet = pct, fmt.Sprintf("%d of %d addresses of %s", n, size, rs)
			if sev != "" {
				worst = sev
			}
		}
	}
	ev["rangeSets"] = sets
	leaked, leakNote := d.leaks(st, live, leakSkip, now)
	ev["leakCheck"] = leakNote
	if len(leaked) > 0 {
		ev["leaked"] = len(leaked)
	}
	judged := fmt.Sprintf("network %s: %d allocated in %s (%s); %s", c.Network, len(st.Allocations), st.Dir, worstSet, leakNote)
	if worst != "" {
		what := "nearly exhausted"
		if worst == finding.Critical {
			what = "exhausted: new pods get no address (\"no IP addresses available in range set\")"
		}
		msg := fmt.Sprintf("host-local IPAM of network %s on node %s %s: %s allocated (%.1f%%)", c.Network, d.n.Name, what, worstSet, worstPct)
		if len(leaked) > 0 {
			msg += fmt.Sprintf(", %d of them leaked to container IDs the runtime does not have", len(leaked))
		}
		out = append(out, finding.Finding{Detector: "HostLocalIPAM", Target: IPAMTarget(c.Network), Severity: worst, Message: msg, Evidence: ev})
	}
	if len(leaked) > 0 {
		out = append(out, d.leakFinding(c.Network, st, leaked, now))
	}
	return out, judged, nil
}

// leaks are the allocations (read, well-formed) of a container ID the
// runtime does not have, older than LeakGrace; the note says how the check
// went.
func (d *hostLocalIPAM) leaks(st hostlocal.Network, live map[string]bool, skip string, now time.Time) ([]hostlocal.Allocation, string) {
	if live == nil {
		return nil, "leak check skipped: " + skip
	}
	var out []hostlocal.Allocation
	young, unreadable := 0, 0
	for _, a := range st.Allocations {
		if !a.Read || a.Err != "" {
			unreadable++
			continue
		}
		if live[a.ContainerID] {
			continue
		}
		if !a.ModTime.IsZero() && now.Sub(a.ModTime) < d.p.LeakGrace.Duration {
			young++
			continue
		}
		out = append(out, a)
	}
	note := fmt.Sprintf("leak check: %d of %d allocations belong to no sandbox of the runtime's %d", len(out), len(st.Allocations), len(live))
	if young > 0 {
		note += fmt.Sprintf(", %d more younger than %s", young, d.p.LeakGrace.Duration)
	}
	if unreadable > 0 {
		note += fmt.Sprintf(", %d not read or unreadable", unreadable)
	}
	return out, note
}

func (d *hostLocalIPAM) leakFinding(network string, st hostlocal.Network, leaked []hostlocal.Allocation, now time.Time) finding.Finding {
	sort.Slice(leaked, func(i, j int) bool { return leaked[i].ModTime.Before(leaked[j].ModTime) })
	var list []map[string]any
	var names []string
	for _, a := range leaked[:min(len(leaked), d.p.MaxListed)] {
		id := a.ContainerID
		if len(id) > 12 {
			id = id[:12]
		}
		list = append(list, map[string]any{"ip": a.IP.String(), "containerID": a.ContainerID, "ifName": a.IfName,
			"since": a.ModTime.UTC().Format(time.RFC3339), "ageSeconds": durSeconds(now.Sub(a.ModTime))})
		names = append(names, a.IP.String()+" ("+id+")")
	}
	more := ""
	if len(leaked) > len(names) {
		more = fmt.Sprintf(" and %d more", len(leaked)-len(names))
	}
	return finding.Finding{Detector: "HostLocalIPAM", Target: IPAMTarget(network) + "/leaked", Severity: finding.Warning,
		Message: fmt.Sprintf("host-local IPAM of network %s on node %s: %d addresses allocated to container IDs the runtime does not have (leaked: a CNI DEL that never ran): %s%s",
			network, d.n.Name, len(leaked), strings.Join(names, ", "), more),
		Evidence: map[string]any{"network": network, "store": st.Dir, "leaked": len(leaked), "addresses": list, "leakGrace": d.p.LeakGrace.Duration.String()}}
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }
