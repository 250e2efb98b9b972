package detect

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/portmap"
	"github.com/remediate-dev/remediate/policy"
)

// HostPorts: every running pod of this node with a container port that
// has a hostPort must have its DNAT in the CNI portmap plugin's rules. The
// plugin writes them only when the pod's sandbox is created (CNI ADD), so
// a firewall flush (rancher/rke2#10469: firewalld's reload with
// FlushAllOnReload) leaves the hostPort dead for good: kube-proxy rebuilds
// its own chains, nobody rebuilds portmap's. The rules are read by save
// (iptables-{legacy,nft}-save, never the xtables lock) and, when present,
// from portmap's nftables backend table (`table ip cni_hostport`, ip6).

// HostPortsParams are the options of HostPorts.
type HostPortsParams struct {
	// MinAge is how long a pod must have had its sandbox (its
	// PodReadyToStartContainers condition True, else its creation) before a
	// missing DNAT counts: the watch may show a pod whose sandbox is being
	// recreated (default 1m).
	MinAge policy.Duration `yaml:"minAge"`
	// SaveTimeout bounds each save and the nftables listing (default 8s).
	SaveTimeout policy.Duration `yaml:"saveTimeout"`
	// MaxPods bounds the findings of one cycle, one per pod (default 20,
	// at most 200); the judged line counts them all.
	MaxPods int `yaml:"maxPods"`
}

// SetDefaults sets the defaults of HostPorts (registry.Defaulter).
func (p *HostPortsParams) SetDefaults() {
	*p = HostPortsParams{MinAge: policy.D(time.Minute), SaveTimeout: policy.D(8 * time.Second), MaxPods: 20}
}

// Validate implements policy.Validator.
func (p *HostPortsParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.MinAge.Duration < 0 {
		errs = append(errs, policy.FieldError{Field: "minAge", Msg: "must be >= 0"})
	}
	if p.SaveTimeout.Duration <= 0 || p.SaveTimeout.Duration > time.Minute {
		errs = append(errs, policy.FieldError{Field: "saveTimeout", Msg: "must be > 0 and at most 1m"})
	}
	if p.MaxPods < 1 || p.MaxPods > 200 {
		errs = append(errs, policy.FieldError{Field: "maxPods", Msg: "must be between 1 and 200"})
	}
	return errs
}

func init() {
	Define("HostPorts",
		"running pods of this node with a hostPort whose DNAT is missing from the CNI portmap plugin's rules (iptables CNI-HOSTPORT-DNAT -> CNI-DN-* in either backend, or portmap's nftables table cni_hostport): one finding per pod naming each missing hostPort, protocol and family; portmap writes them only when the sandbox is created, so after a firewall flush the hostPort stays dead until the pod's sandbox is recreated",
		newHostPorts, Targets(finding.KindPod))
}

type hostPorts struct {
	p HostPortsParams
	n *node.Node
	judgement
	mu sync.Mutex
	// seenPortmap is whether portmap's rules were ever seen on this node:
	// after a flush they are gone, and a CNI configuration that does not
	// name portmap (a chained file written by an agent) still had them.
	seenPortmap bool
}

func newHostPorts(p *HostPortsParams, n *node.Node) (Detector, error) {
	return &hostPorts{p: *p, n: n}, nil
}

// HostPortRules is what one cycle read of the portmap rules.
type HostPortRules struct {
	DNATs []portmap.DNAT
	// Unknown are the families some source of which could not be read
	// (a save failed or timed out): a mapping not found there is unknown,
	// not missing.
	Unknown map[iptables.Family]string
}

// MissingHostPort is one hostPort mapping without its DNAT.
type MissingHostPort struct {
	Pod           cluster.PodRef
	Container     string
	HostPort      int32
	ContainerPort int32
	Protocol      string // as in the pod spec: TCP, UDP, SCTP
	HostIP        string
	Family        iptables.Family
	PodIP         string
}

// String names the mapping as the finding does.
func (m MissingHostPort) String() string {
	s := fmt.Sprintf("%s %d/%s -> %s:%d", m.Family, m.HostPort, m.Protocol, m.PodIP, m.ContainerPort)
	if m.HostIP != "" {
		s = m.HostIP + ":" + s
	}
	return s
}

// hostPortSince is when the pod's sandbox was last (re)created as far as
// the API says.
func hostPortSince(p *cluster.Pod) time.Time {
	if p.SandboxReady.IsTrue() && !p.SandboxReady.Since.IsZero() {
		return p.SandboxReady.Since
	}
	return p.Created
}

// ipFamily is the family of an address ("" when it is none).
func ipFamily(s string) iptables.Family {
	ip := net.ParseIP(s)
	switch {
	case ip == nil:
		return ""
	case ip.To4() != nil:
		return iptables.IPv4
	default:
		return iptables.IPv6
	}
}

// ClassifyHostPorts returns the hostPort mappings of pods that have no
// DNAT in rules, and how many mappings were checked. A pod counts when
// it runs (phase Running, not terminating, not host-network: a
// host-network pod's hostPort is its own socket) with IPs, and its
// sandbox is at least minAge old at now. A mapping is expected in every
// family of the pod's IPs (only the family of its hostIP when one is
// set, as portmap skips the other); it is missing when no DNAT of that
// family, protocol and hostPort goes to that pod IP and containerPort,
// bound to the hostIP or to any address. A family in rules.Unknown is
// never judged.
func ClassifyHostPorts(pods []cluster.Pod, rules HostPortRules, now time.Time, minAge time.Duration) (missing []MissingHostPort, checked int) {
	for i := range pods {
		p := &pods[i]
		if len(p.HostPorts) == 0 || p.HostNetwork || p.Terminating || p.Phase != "Running" || len(p.IPs) == 0 {
			continue
		}
		if p.SandboxReady.IsFalse() || now.Sub(hostPortSince(p)) < minAge {
			continue
		}
		seen := map[string]bool{}
		for _, hp := range p.HostPorts {
			hostIP := hp.HostIP
			if ip := net.ParseIP(hostIP); ip != nil && ip.IsUnspecified() {
				hostIP = "" // 0.0.0.0 / :: is any address, in that family only
			}
			for _, podIP := range p.IPs {
				fam := ipFamily(podIP)
				if fam == "" {
					continue
				}
				if hp.HostIP != "" && ipFamily(hp.HostIP) != fam {
					continue
				}
				key := fmt.Sprintf("%s/%s/%d/%s", fam, hp.Protocol, hp.HostPort, hostIP)
				if seen[key] {
					continue // the kubelet maps one hostPort/protocol/hostIP once
				}
				seen[key] = true
				if _, unknown := rules.Unknown[fam]; unknown {
					continue
				}
				checked++
				if portmap.Has(rules.DNATs, fam, hp.Protocol, hp.HostPort, hostIP, podIP, hp.ContainerPort) {
					continue
				}
				missing = append(missing, MissingHostPort{Pod: cluster.PodRef{Namespace: p.Namespace, Name: p.Name}, Container: hp.Container,
					HostPort: hp.HostPort, ContainerPort: hp.ContainerPort, Protocol: hp.Protocol, HostIP: hostIP, Family: fam, PodIP: podIP})
			}
		}
	}
	sort.SliceStable(missing, func(i, j int) bool { return missing[i].Pod.String() < missing[j].Pod.String() })
	return missing, checked
}

// readHostPortRules reads portmap's rules of both families from both
// iptables backends and portmap's nftables table. portmapSeen says
// whether any of portmap's chains or tables exists.
func (d *hostPorts) readHostPortRules(ctx context.Context) (rules HostPortRules, portmapSeen bool) {
	rules.Unknown = map[iptables.Family]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		for _, be := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
			if d.n.IPTables == nil {
				break
			}
			wg.Add(1)
			go func(fam iptables.Family, be iptables.Backend) {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, d.p.SaveTimeout.Duration)
				defer cancel()
				s, err := d.n.IPTables.Save(sctx, fam, be)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if !errors.Is(err, iptables.ErrUnavailable) {
						rules.Unknown[fam] = fmt.Sprintf("%s: %v", iptables.SaveCommand(fam, be), err)
					}
					return
				}
				dn, present := portmap.FromIPTables(s.Rules, fam, "iptables-"+string(be))
				rules.DNATs = append(rules.DNATs, dn...)
				portmapSeen = portmapSeen || present
			}(fam, be)
		}
		if d.n.NFTables != nil {
			wg.Add(1)
			go func(fam iptables.Family) {
				defer wg.Done()
				sctx, cancel := context.WithTimeout(ctx, d.p.SaveTimeout.Duration)
				defer cancel()
				s, err := d.n.NFTables.ListTable(sctx, portmap.NFTFamily(fam), portmap.NFTTable)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					if !errors.Is(err, nftables.ErrNoTable) && !errors.Is(err, nftables.ErrUnavailable) {
						rules.Unknown[fam] = fmt.Sprintf("nft list table %s %s: %v", portmap.NFTFamily(fam), portmap.NFTTable, err)
					}
					return
				}
				if s == nil || s.Ruleset == nil {
					return
				}
				t := s.Ruleset.Table(portmap.NFTFamily(fam), portmap.NFTTable)
				if t != nil {
					portmapSeen = true
					rules.DNATs = append(rules.DNATs, portmap.FromNFT(t, fam)...)
				}
			}(fam)
		}
	}
	wg.Wait()
	return rules, portmapSeen
}

// portmapConfigured says whether the CNI configuration in use chains the
// portmap plugin.
func (d *hostPorts) portmapConfigured(ctx context.Context) bool {
	if d.n.CNI == nil && d.n.CNIConfDir == "" {
		return false
	}
	dir := readCNI(ctx, d.n)
	if f := dir.InUse(); f != nil {
		for _, p := range f.Plugins {
			if p == "portmap" {
				return true
			}
		}
	}
	return false
}

func (d *hostPorts) Detect(ctx context.Context) ([]finding.Finding, error) {
	view, err := podView(d.n)
	if err != nil {
		return nil, err
	}
	if d.n.IPTables == nil && d.n.NFTables == nil {
		return nil, finding.Skip("neither iptables nor nftables can be read: %s", d.n.Why("iptables"))
	}
	pods := view.NodePods()
	withPorts := 0
	for i := range pods {
		if len(pods[i].HostPorts) > 0 && !pods[i].HostNetwork {
			withPorts++
		}
	}
	if withPorts == 0 {
		d.set("no pod of node %s has a hostPort (of %d pods)", d.n.Name, len(pods))
		return nil, nil
	}
	rules, seen := d.readHostPortRules(ctx)
	d.mu.Lock()
	if seen {
		d.seenPortmap = true
	}
	seenBefore := d.seenPortmap
	d.mu.Unlock()
	configured := d.portmapConfigured(ctx)
	if !seen && !seenBefore && !configured {
		return nil, finding.Skip("%d pods have a hostPort, but this node's CNI configuration does not chain portmap and no portmap chain or table was ever seen: the CNI serves hostPorts its own way", withPorts)
	}
	now := d.n.Clock.Now()
	missing, checked := ClassifyHostPorts(pods, rules, now, d.p.MinAge.Duration)
	var unknown []string
	for f, why := range rules.Unknown {
		unknown = append(unknown, string(f)+" ("+why+")")
	}
	sort.Strings(unknown)
	byPod := map[string][]MissingHostPort{}
	var order []string
	for _, m := range missing {
		k := m.Pod.String()
		if _, ok := byPod[k]; !ok {
			order = append(order, k)
		}
		byPod[k] = append(byPod[k], m)
	}
	judged := fmt.Sprintf("%d hostPort mappings of %d pods checked, %d missing their DNAT (%d pods)", checked, withPorts, len(missing), len(order))
	if len(unknown) > 0 {
		judged += "; not judged: " + strings.Join(unknown, ", ")
	}
	d.set("%s", judged)
	podsByRef := map[string]*cluster.Pod{}
	for i := range pods {
		podsByRef[cluster.PodRef{Namespace: pods[i].Namespace, Name: pods[i].Name}.String()] = &pods[i]
	}
	var out []finding.Finding
	for _, k := range order[:min(len(order), d.p.MaxPods)] {
		ms := byPod[k]
		p := podsByRef[k]
		var names []string
		var listed []map[string]any
		for _, m := range ms {
			names = append(names, m.String())
			e := map[string]any{"hostPort": m.HostPort, "protocol": m.Protocol, "family": string(m.Family),
				"podIP": m.PodIP, "containerPort": m.ContainerPort, "container": m.Container}
			if m.HostIP != "" {
				e["hostIP"] = m.HostIP
			}
			listed = append(listed, e)
		}
		ev := map[string]any{"pod": ms[0].Pod.Namespace + "/" + ms[0].Pod.Name, "missing": listed,
			"portmapConfigured": configured, "portmapRulesPresent": seen}
		owner := "a bare pod (no controller): deleting it would not bring it back"
		if p != nil {
			ev["uid"] = p.UID
			ev["sandboxSince"] = hostPortSince(p).UTC().Format(time.RFC3339)
			if p.ControllerKind != "" {
				ev["controllerKind"], ev["controllerName"] = p.ControllerKind, p.ControllerName
				owner = "owned by " + p.ControllerKind + " " + p.ControllerName
			} else if p.MirrorOf != "" {
				owner = "a static pod (mirror)"
			}
		}
		why := "portmap's rules are gone (a firewall flush such as firewalld's FlushAllOnReload, or iptables -F/-X)"
		if seen {
			why = "portmap's chains exist but not this pod's rule (removed by hand, or by a CNI DEL of another sandbox)"
		}
		subject := finding.Subject{Kind: finding.KindPod}
		if p != nil {
			subject.Pod = &finding.Pod{UID: p.UID}
		}
		out = append(out, finding.Finding{
			Detector: "HostPorts",
			Target:   ms[0].Pod.String(),
			Subject:  subject,
			Severity: finding.Critical,
			Message: fmt.Sprintf("pod %s/%s (%s) has no hostPort DNAT for %s: %s; the CNI portmap plugin writes them only when the sandbox is created, so the hostPort stays dead until the pod's sandbox is recreated (delete the pod so its controller replaces it)",
				ms[0].Pod.Namespace, ms[0].Pod.Name, owner, strings.Join(names, ", "), why),
			Evidence: ev,
		})
	}
	return out, nil
}
