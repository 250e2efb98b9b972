package kubeproxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/clip"
)

// Configz is the part of kube-proxy's /configz the detectors use.
type Configz struct {
	// SyncPeriod is kube-proxy's effective syncPeriod.
	SyncPeriod time.Duration
	// MinSyncPeriod is its minSyncPeriod (0 when absent).
	MinSyncPeriod time.Duration
	// Mode is the configured proxy mode ("" means the platform default).
	Mode string
	// ClusterCIDR is clusterCIDR as configured (comma-separated CIDRs;
	// "" unset), clipped to 256 bytes.
	ClusterCIDR string
	// IPVSExcludeCIDRs is ipvs.excludeCIDRs as configured: the ranges
	// whose IPVS virtual servers kube-proxy's IPVS cleanup never deletes
	// (nil: none). ExcludedCIDRs parses them.
	IPVSExcludeCIDRs []string
	// excludeTruncated: /configz listed more than MaxExcludeCIDRs.
	excludeTruncated bool
}

// MaxExcludeCIDRs bounds ipvs.excludeCIDRs kept from /configz: for a
// longer list ExcludedCIDRs is an error (its exclusions would be unknown).
const MaxExcludeCIDRs = 1024

// ExcludedCIDRs parses IPVSExcludeCIDRs as kube-proxy does (its
// netutils.ParseCIDRs: IPv4 octets with leading zeros are decimal), each
// masked to its network. Any entry that does not parse is an error: the
// caller cannot know what kube-proxy excludes, and must not guess.
func (c *Configz) ExcludedCIDRs() ([]netip.Prefix, error) {
	if c == nil {
		return nil, fmt.Errorf("no /configz")
	}
	if c.excludeTruncated {
		return nil, fmt.Errorf("ipvs.excludeCIDRs lists more than %d CIDRs", MaxExcludeCIDRs)
	}
	out := make([]netip.Prefix, 0, len(c.IPVSExcludeCIDRs))
	for _, s := range c.IPVSExcludeCIDRs {
		p, err := ParseCIDRSloppy(s)
		if err != nil {
			return nil, fmt.Errorf("ipvs.excludeCIDRs: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// ParseCIDRSloppy parses a CIDR as k8s.io/utils/net.ParseCIDRSloppy does:
// like net.ParseCIDR, but IPv4 octets may carry leading zeros (read as
// decimal, "010.0.0.0/8" is 10.0.0.0/8). The prefix is masked.
func ParseCIDRSloppy(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Masked(), nil
	}
	addr, bits, ok := strings.Cut(s, "/")
	if !ok || strings.Contains(addr, ":") {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", clip.String(s, 64))
	}
	octets := strings.Split(addr, ".")
	if len(octets) != 4 {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", clip.String(s, 64))
	}
	for i, o := range octets {
		t := strings.TrimLeft(o, "0")
		if t == "" && o != "" {
			t = "0"
		}
		octets[i] = t
	}
	p, err := netip.ParsePrefix(strings.Join(octets, ".") + "/" + bits)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a CIDR", clip.String(s, 64))
	}
	return p.Masked(), nil
}

// ConfigReader is implemented by adapters that can read kube-proxy's
// /configz (served next to /metrics). Once Configz succeeded, SyncPeriod
// returns the discovered value, so every threshold relative to syncPeriod
// uses it; ConfiguredSyncPeriod still returns the policy's.
type ConfigReader interface {
	Configz(ctx context.Context) (*Configz, error)
	ConfiguredSyncPeriod() time.Duration
}

// ParseConfigz reads /configz: {"kubeproxy.config.k8s.io": {...}} holding
// kube-proxy's internal configuration, whose JSON keys are Go field names
// (1.34: top-level SyncPeriod and MinSyncPeriod; before 1.33 they sat under
// IPTables, IPVS and NFTables, per mode). Lower-case (versioned) keys are
// accepted too. A configuration without a positive syncPeriod is an error.
func ParseConfigz(body []byte) (*Configz, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("configz: %w", err)
	}
	raw, ok := top["kubeproxy.config.k8s.io"]
	if !ok {
		return nil, fmt.Errorf("configz: no kubeproxy.config.k8s.io section")
	}
	type periods struct {
		SyncPeriod    string `json:"SyncPeriod"`
		MinSyncPeriod string `json:"MinSyncPeriod"`
	}
	type periodsLower struct {
		SyncPeriod    string `json:"syncPeriod"`
		MinSyncPeriod string `json:"minSyncPeriod"`
	}
	type ipvsConfig struct {
		periods
		ExcludeCIDRs []string `json:"ExcludeCIDRs"`
	}
	type ipvsConfigLower struct {
		periodsLower
		ExcludeCIDRs []string `json:"excludeCIDRs"`
	}
	var cfg struct {
		periods
		Mode        string     `json:"Mode"`
		ClusterCIDR string     `json:"ClusterCIDR"`
		IPTables    periods    `json:"IPTables"`
		IPVS        ipvsConfig `json:"IPVS"`
		NFTables    periods    `json:"NFTables"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("configz: %w", err)
	}
	var lower struct {
		periodsLower
		Mode        string          `json:"mode"`
		ClusterCIDR string          `json:"clusterCIDR"`
		IPTables    periodsLower    `json:"iptables"`
		IPVS        ipvsConfigLower `json:"ipvs"`
		NFTables    periodsLower    `json:"nftables"`
	}
	_ = json.Unmarshal(raw, &lower) // best effort: only fills gaps
	mode := cfg.Mode
	if mode == "" {
		mode = lower.Mode
	}
	pick := func(cands ...string) string {
		for _, c := range cands {
			if c != "" {
				return c
			}
		}
		return ""
	}
	perMode := func(m string) (periods, periodsLower) {
		switch m {
		case "ipvs":
			return cfg.IPVS.periods, lower.IPVS.periodsLower
		case "nftables":
			return cfg.NFTables, lower.NFTables
		default:
			return cfg.IPTables, lower.IPTables
		}
	}
	pm, pl := perMode(mode)
	sp := pick(cfg.SyncPeriod, lower.SyncPeriod, pm.SyncPeriod, pl.SyncPeriod)
	msp := pick(cfg.MinSyncPeriod, lower.MinSyncPeriod, pm.MinSyncPeriod, pl.MinSyncPeriod)
	out := &Configz{Mode: mode, ClusterCIDR: clip.String(pick(cfg.ClusterCIDR, lower.ClusterCIDR), 256)}
	excl := cfg.IPVS.ExcludeCIDRs
	if excl == nil {
		excl = lower.IPVS.ExcludeCIDRs
	}
	if len(excl) > MaxExcludeCIDRs {
		excl, out.excludeTruncated = excl[:MaxExcludeCIDRs], true
	}
	if len(excl) > 0 {
		out.IPVSExcludeCIDRs = make([]string, len(excl))
		for i, e := range excl {
			out.IPVSExcludeCIDRs[i] = clip.String(e, 64)
		}
	}
	d, err := time.ParseDuration(sp)
	if err != nil || d <= 0 {
		return nil, fmt.Errorf("configz: syncPeriod %q is not a positive duration", sp)
	}
	out.SyncPeriod = d
	if msp != "" {
		if d, err := time.ParseDuration(msp); err == nil && d >= 0 {
			out.MinSyncPeriod = d
		}
	}
	return out, nil
}

// ConfigzURL is /configz on the metrics server of metricsURL ("" when it
// does not parse).
func ConfigzURL(metricsURL string) string {
	u, err := url.Parse(metricsURL)
	if err != nil {
		return ""
	}
	u.Path, u.RawQuery = "/configz", ""
	return u.String()
}

// Configz implements ConfigReader: GET /configz on the metrics address,
// cached like the other answers.
func (c *Client) Configz(ctx context.Context) (*Configz, error) {
	u := ConfigzURL(c.opts.MetricsURL)
	return c.config.get(ctx, c.clock, c.opts.CacheTTL, func() (*Configz, error) {
		status, body, err := c.get(ctx, u, "application/json")
		if err != nil {
			return nil, err
		}
		if status != http.StatusOK {
			return nil, &Error{Kind: KindBadResponse, URL: u, Err: fmt.Errorf("HTTP %d: %s", status, snippet(body))}
		}
		cz, err := ParseConfigz(body)
		if err != nil {
			return nil, &Error{Kind: KindBadResponse, URL: u, Err: err}
		}
		c.discovered.Store(int64(cz.SyncPeriod))
		return cz, nil
	})
}

// IPVSExcludeCIDRs reads kube-proxy's ipvs.excludeCIDRs from its /configz
// through kp (which must be a ConfigReader). Any failure is an error: the
// caller decides whether to go on without them (a report, with a note) or
// refuse (a deletion).
func IPVSExcludeCIDRs(ctx context.Context, kp Interface) ([]netip.Prefix, error) {
	cr, ok := kp.(ConfigReader)
	if kp == nil || !ok {
		return nil, fmt.Errorf("kube-proxy's /configz is not read here (no kube-proxy metrics address configured)")
	}
	cz, err := cr.Configz(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading kube-proxy's /configz: %w", err)
	}
	return cz.ExcludedCIDRs()
}
