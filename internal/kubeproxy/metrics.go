package kubeproxy

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/remediate-dev/remediate/internal/clip"
	"github.com/remediate-dev/remediate/internal/finding"
)

// Metric names read from kube-proxy (kubeproxy_-prefixed, and client-go's
// request counter).
const (
	metricRESTRequests    = "rest_client_requests_total"
	metricLastSync        = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
	metricLastQueued      = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
	metricSyncDuration    = "kubeproxy_sync_proxy_rules_duration_seconds"
	metricEndpointPending = "kubeproxy_sync_proxy_rules_endpoint_changes_pending"
	metricServicePending  = "kubeproxy_sync_proxy_rules_service_changes_pending"
	metricRestoreFailures = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
	metricPartialFailures = "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total"
	metricRulesTotal      = "kubeproxy_sync_proxy_rules_iptables_total"
	metricNFTSyncFailures = "kubeproxy_sync_proxy_rules_nftables_sync_failures_total"
	metricNFTCleanupFails = "kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total"
	metricEndpointChanges = "kubeproxy_sync_proxy_rules_endpoint_changes_total"
	// kube-proxy 1.32+ reconciles stale UDP conntrack entries itself after
	// each sync (names as the real v1.34.4 exports them, per ip_family).
	metricCTReconcilerSyncs   = "kubeproxy_conntrack_reconciler_sync_duration_seconds"
	metricCTReconcilerDeleted = "kubeproxy_conntrack_reconciler_deleted_entries_total"
	metricBuildInfo           = "kubernetes_build_info"
)

// FamilyLabel is the label kube-proxy 1.33+ puts on its per-family series.
const FamilyLabel = "ip_family"

// Unlabelled is the Family of series from kube-proxy 1.30-1.32, which carry
// no ip_family label: on a dual-stack node both proxiers write the same
// series, so a value describes whichever family synced last.
const Unlabelled Family = ""

// Family is an IP family as kube-proxy names it: "IPv4", "IPv6", or
// Unlabelled.
type Family string

// Target returns the finding target for the family: "kube-proxy/IPv4",
// or "kube-proxy" for Unlabelled.
func (f Family) Target() string {
	if f == Unlabelled {
		return "kube-proxy"
	}
	return "kube-proxy/" + string(f)
}

// Kind is finding.KindKubeProxy: a Family is the typed reference of the
// kube-proxy findings, Target its encoding and FamilyFromTarget its
// decoding.
func (Family) Kind() finding.Kind { return finding.KindKubeProxy }

// FamilyFromTarget decodes a target written by Family.Target.
func FamilyFromTarget(t string) (Family, error) {
	if t == "kube-proxy" {
		return Unlabelled, nil
	}
	f, ok := strings.CutPrefix(t, "kube-proxy/")
	if !ok || (f != "IPv4" && f != "IPv6") {
		return "", fmt.Errorf("target %q is not a kube-proxy IP family", t)
	}
	return Family(f), nil
}

// String names the family for messages.
func (f Family) String() string {
	if f == Unlabelled {
		return "all families (kube-proxy < 1.33 reports no ip_family)"
	}
	return string(f)
}

// Bucket is one cumulative histogram bucket.
type Bucket struct {
	UpperBound      float64 `json:"le"`
	CumulativeCount uint64  `json:"count"`
}

// Histogram is a cumulative Prometheus histogram (buckets sorted by upper
// bound; a +Inf bucket is implied by Count).
type Histogram struct {
	Buckets []Bucket `json:"buckets"`
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"`
}

// Sub returns h − older, the observations made between two scrapes. ok is
// false when the two are not comparable (different buckets) or when a count
// went down (kube-proxy restarted: its counters reset).
func (h Histogram) Sub(older Histogram) (Histogram, bool) {
	if len(h.Buckets) != len(older.Buckets) || h.Count < older.Count {
		return Histogram{}, false
	}
	d := Histogram{Buckets: make([]Bucket, len(h.Buckets)), Count: h.Count - older.Count, Sum: h.Sum - older.Sum}
	for i, b := range h.Buckets {
		o := older.Buckets[i]
		if b.UpperBound != o.UpperBound || b.CumulativeCount < o.CumulativeCount {
			return Histogram{}, false
		}
		d.Buckets[i] = Bucket{UpperBound: b.UpperBound, CumulativeCount: b.CumulativeCount - o.CumulativeCount}
	}
	return d, true
}

// Quantile estimates the q-quantile (0 < q < 1) the way Prometheus'
// histogram_quantile does: linear interpolation inside the bucket holding
// the rank, the lower bound of the first bucket taken as 0. When the rank
// falls in the implicit +Inf bucket, it returns the highest finite upper
// bound and inf = true (the true value is "above that"). ok is false when
// the histogram holds no observations.
func (h Histogram) Quantile(q float64) (v float64, inf bool, ok bool) {
	if h.Count == 0 || len(h.Buckets) == 0 || math.IsNaN(q) {
		return 0, false, false
	}
	rank := q * float64(h.Count)
	var prevBound float64
	var prevCount uint64
	for _, b := range h.Buckets {
		if math.IsInf(b.UpperBound, 1) {
			break
		}
		if float64(b.CumulativeCount) >= rank {
			inBucket := b.CumulativeCount - prevCount
			if inBucket == 0 {
				return b.UpperBound, false, true
			}
			return prevBound + (b.UpperBound-prevBound)*(rank-float64(prevCount))/float64(inBucket), false, true
		}
		prevBound, prevCount = b.UpperBound, b.CumulativeCount
	}
	return prevBound, true, true
}

// FamilyMetrics are the per-family series of one scrape. A nil pointer
// means the series was absent (an older kube-proxy, another mode, or a
// family that has not synced yet).
type FamilyMetrics struct {
	Family Family
	// LastSync is sync_proxy_rules_last_timestamp_seconds (Unix seconds):
	// the last successful sync.
	LastSync *float64
	// LastQueued is sync_proxy_rules_last_queued_timestamp_seconds: the
	// last time a sync was requested.
	LastQueued *float64
	// SyncDuration is the lifetime sync_proxy_rules_duration_seconds
	// histogram.
	SyncDuration *Histogram
	// RestoreFailures and PartialRestoreFailures are the iptables-restore
	// failure counters (iptables mode; RestoreFailures also in ipvs mode).
	RestoreFailures        *float64
	PartialRestoreFailures *float64
	// RulesTotal is sync_proxy_rules_iptables_total by table.
	RulesTotal map[string]float64
	// NFTablesSyncFailures is sync_proxy_rules_nftables_sync_failures_total
	// (nftables mode: a sync whose nft transaction failed, leaving the
	// table as it was) and NFTablesCleanupFailures
	// sync_proxy_rules_nftables_cleanup_failures_total (stale chains that
	// could not be deleted). From 1.33 they are per-family vectors that
	// appear with their first increment: absent means zero there.
	NFTablesSyncFailures    *float64
	NFTablesCleanupFailures *float64
	// ConntrackReconcilerSyncs is conntrack_reconciler_sync_duration_seconds
	// (kube-proxy 1.32+: its own cleanup of stale UDP conntrack entries,
	// one observation per run) and ConntrackReconcilerDeleted
	// conntrack_reconciler_deleted_entries_total (the entries it deleted).
	// Nil on older kube-proxy.
	ConntrackReconcilerSyncs   *Histogram
	ConntrackReconcilerDeleted *float64
}

// Metrics is one parsed scrape of kube-proxy's /metrics.
type Metrics struct {
	// Labelled is true when the series carry ip_family (kube-proxy 1.33+).
	Labelled bool
	// Families holds the per-family series, keyed by family ("IPv4",
	// "IPv6", or Unlabelled for 1.30-1.32).
	Families map[Family]*FamilyMetrics
	// IgnoredFamilies counts samples whose ip_family is not IPv4 or IPv6.
	IgnoredFamilies int
	// EndpointChangesPending and ServiceChangesPending are node-wide gauges
	// (no ip_family label in any version).
	EndpointChangesPending *float64
	ServiceChangesPending  *float64
	// EndpointChangesTotal is the node-wide counter of endpoint changes
	// kube-proxy received (sync_proxy_rules_endpoint_changes_total): its
	// rate is the endpoint churn.
	EndpointChangesTotal *float64
	// GitVersion is kubernetes_build_info's git_version ("v1.34.4"; ""
	// when absent, clipped to 64 bytes).
	GitVersion string
	// RESTRequests is client-go's rest_client_requests_total summed over
	// host and method, by HTTP code ("<error>" for requests that got no
	// response: transport errors, timeouts). kube-proxy's list and watch
	// calls to the API server are among them; a kube-proxy whose count
	// stops moving, or moves only in errors, is not hearing the API.
	// Nil when kube-proxy exports no such series.
	RESTRequests map[string]float64
}

// RESTErrors sums RESTRequests whose code is an error: "<error>", 403,
// 429 and 5xx.
func (m *Metrics) RESTErrors() float64 {
	var n float64
	for code, v := range m.RESTRequests {
		if IsRESTError(code) {
			n += v
		}
	}
	return n
}

// IsRESTError reports whether a rest_client_requests_total code is one of
// the API errors that leave kube-proxy without updates: no response at all
// ("<error>": transport errors, timeouts), 403 (its credentials or RBAC
// refused: field guide 5 lists it with 429 and 5xx), 429 (throttled) and
// 5xx (the API server failing; field guide 1 names 429 and 5xx).
func IsRESTError(code string) bool {
	return code == "<error>" || code == "403" || code == "429" || (len(code) == 3 && code[0] == '5')
}

// RESTTotal sums RESTRequests over every code.
func (m *Metrics) RESTTotal() float64 {
	var n float64
	for _, v := range m.RESTRequests {
		n += v
	}
	return n
}

// KnownFamily reports whether v is an IP family kube-proxy reports
// ("IPv4", "IPv6"). Series with any other ip_family value are ignored
// (counted in Metrics.IgnoredFamilies): a broken or hostile endpoint must
// not turn into one target per label value.
func KnownFamily(v string) bool { return v == "IPv4" || v == "IPv6" }

// FamilyNames returns the families present, sorted.
func (m *Metrics) FamilyNames() []Family {
	out := make([]Family, 0, len(m.Families))
	for f := range m.Families {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// MinorVersion returns the minor version of GitVersion ("v1.34.4" -> 34);
// ok is false when it is absent or not a v1.N version (a build from
// source says "v0.0.0-master").
func (m *Metrics) MinorVersion() (int, bool) {
	v, ok := strings.CutPrefix(m.GitVersion, "v1.")
	if !ok {
		return 0, false
	}
	end := 0
	for end < len(v) && end < 4 && v[end] >= '0' && v[end] <= '9' {
		end++
	}
	if end == 0 {
		return 0, false
	}
	n := 0
	for _, c := range v[:end] {
		n = n*10 + int(c-'0')
	}
	return n, true
}

// ParseMetrics parses the Prometheus text exposition format and extracts
// the kube-proxy series the detectors use. Both label schemas are accepted.
// It fails on malformed input; it does not bound the input (callers limit
// the reader).
//
// Only the lines of the families read are parsed (FamilyLines): the whole
// exposition is ~100 kB, mostly client-go's and the Go runtime's
// histograms, and parsing all of it cost ~4 ms and 20k allocations a
// scrape (BenchmarkParseMetrics), about one scrape a cycle.
func ParseMetrics(r io.Reader) (*Metrics, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return parseMetrics(b)
}

// readFamilies are the families ParseMetrics reads (of ~60 in a v1.34
// exposition; the sync histograms it does not read are most of the
// kubeproxy_ lines).
var readFamilies = map[string]bool{
	metricRESTRequests: true, metricLastSync: true, metricLastQueued: true, metricSyncDuration: true,
	metricEndpointPending: true, metricServicePending: true, metricRestoreFailures: true, metricPartialFailures: true,
	metricRulesTotal: true, metricNFTSyncFailures: true, metricNFTCleanupFails: true, metricEndpointChanges: true,
	metricCTReconcilerSyncs: true, metricCTReconcilerDeleted: true, metricBuildInfo: true,
}

// readFamily reports whether ParseMetrics reads the family name.
func readFamily(name []byte) bool { return readFamilies[string(name)] }

// parseMetrics is ParseMetrics of a body read: its families' lines only.
func parseMetrics(b []byte) (*Metrics, error) {
	lines, ok := FamilyLines(b, readFamily)
	if !ok {
		// No # HELP or # TYPE line: untyped samples alone, or not an
		// exposition at all (an HTML page); the whole body decides.
		lines = b
	}
	fams, err := ParseText(bytes.NewReader(lines))
	if err != nil {
		return nil, err
	}
	return metricsOf(fams), nil
}

// metricsOf extracts the series read from parsed families.
func metricsOf(fams map[string]*dto.MetricFamily) *Metrics {
	m := &Metrics{Families: map[Family]*FamilyMetrics{}}
	// Decide the schema from the sync timestamp series, which every
	// version exports: labelled if any of its samples has ip_family.
	for _, name := range []string{metricLastSync, metricSyncDuration, metricLastQueued} {
		if mf := fams[name]; mf != nil {
			for _, s := range mf.GetMetric() {
				if _, ok := label(s, FamilyLabel); ok {
					m.Labelled = true
				}
			}
		}
	}
	fam := func(s *dto.Metric) (*FamilyMetrics, bool) {
		f := Unlabelled
		if v, ok := label(s, FamilyLabel); ok {
			if !KnownFamily(v) {
				m.IgnoredFamilies++
				return nil, false
			}
			f = Family(v)
		} else if m.Labelled {
			return nil, false // unexpected mix: ignore unlabelled samples
		}
		fm := m.Families[f]
		if fm == nil {
			fm = &FamilyMetrics{Family: f}
			m.Families[f] = fm
		}
		return fm, true
	}
	for name, mf := range fams {
		if name == metricBuildInfo {
			for _, s := range mf.GetMetric() {
				if v, ok := label(s, "git_version"); ok {
					m.GitVersion = clip.String(v, 64)
				}
			}
			continue
		}
		if name == metricRESTRequests {
			for _, s := range mf.GetMetric() {
				code, _ := label(s, "code")
				if m.RESTRequests == nil {
					m.RESTRequests = map[string]float64{}
				}
				m.RESTRequests[code] += value(mf.GetType(), s)
			}
			continue
		}
		if !strings.HasPrefix(name, "kubeproxy_") {
			continue
		}
		for _, s := range mf.GetMetric() {
			switch name {
			case metricEndpointPending:
				m.EndpointChangesPending = ptr(value(mf.GetType(), s))
			case metricServicePending:
				m.ServiceChangesPending = ptr(value(mf.GetType(), s))
			case metricEndpointChanges:
				// Node-wide; should a version label it per family, the
				// families add up to the node's churn.
				v := value(mf.GetType(), s)
				if m.EndpointChangesTotal != nil {
					v += *m.EndpointChangesTotal
				}
				m.EndpointChangesTotal = &v
			case metricLastSync, metricLastQueued, metricRestoreFailures, metricPartialFailures, metricRulesTotal, metricSyncDuration,
				metricNFTSyncFailures, metricNFTCleanupFails, metricCTReconcilerSyncs, metricCTReconcilerDeleted:
				fm, ok := fam(s)
				if !ok {
					continue
				}
				switch name {
				case metricLastSync:
					fm.LastSync = ptr(value(mf.GetType(), s))
				case metricLastQueued:
					fm.LastQueued = ptr(value(mf.GetType(), s))
				case metricRestoreFailures:
					fm.RestoreFailures = ptr(value(mf.GetType(), s))
				case metricPartialFailures:
					fm.PartialRestoreFailures = ptr(value(mf.GetType(), s))
				case metricNFTSyncFailures:
					fm.NFTablesSyncFailures = ptr(value(mf.GetType(), s))
				case metricNFTCleanupFails:
					fm.NFTablesCleanupFailures = ptr(value(mf.GetType(), s))
				case metricRulesTotal:
					table, _ := label(s, "table")
					if fm.RulesTotal == nil {
						fm.RulesTotal = map[string]float64{}
					}
					fm.RulesTotal[table] = value(mf.GetType(), s)
				case metricSyncDuration:
					if h := s.GetHistogram(); h != nil {
						fm.SyncDuration = HistogramOf(h)
					}
				case metricCTReconcilerSyncs:
					if h := s.GetHistogram(); h != nil {
						fm.ConntrackReconcilerSyncs = HistogramOf(h)
					}
				case metricCTReconcilerDeleted:
					fm.ConntrackReconcilerDeleted = ptr(value(mf.GetType(), s))
				}
			}
		}
	}
	return m
}

// FamilyLines keeps, of a text exposition, the lines of the families
// keep accepts: their # HELP and # TYPE lines and their samples, in order;
// a sample named name_bucket, name_sum or name_count is kept when keep
// accepts name or its own name. ok is false when b has no # HELP or # TYPE
// line at all (an HTML page, a proxy's error): that is a bad answer, not
// "no series". Lines of other families are not looked into: a malformed
// one is not an error here, where parsing the whole body made it one. A
// body with a sample line starting with "{" (a name inside the braces) is
// returned whole.
func FamilyLines(b []byte, keep func(name []byte) bool) (out []byte, ok bool) {
	all, whole := b, false
	defer func() {
		if whole {
			out = all
		}
	}()
	keepSample := func(name []byte) bool {
		if keep(name) {
			return true
		}
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, found := bytes.CutSuffix(name, []byte(suf)); found && keep(base) {
				return true
			}
		}
		return false
	}
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i+1], b[i+1:]
		} else {
			b = nil
		}
		// As expfmt reads a line: blanks before it, and after the "#"
		// of a comment, are skipped.
		var name []byte
		if rest, found := bytes.CutPrefix(bytes.TrimLeft(line, " \t"), []byte("#")); found {
			kw, after := token(bytes.TrimLeft(rest, " \t"))
			if string(kw) != "HELP" && string(kw) != "TYPE" {
				continue
			}
			ok = true
			name = metricName(bytes.TrimLeft(after, " \t"))
		} else {
			l := bytes.TrimLeft(line, " \t")
			if len(l) > 0 && l[0] == '{' {
				// A name inside the braces (the UTF-8 names'
				// syntax), which no kube-proxy writes: the whole
				// body is parsed, as before.
				whole = true
			}
			name = metricName(l)
		}
		if keepSample(bytes.TrimSpace(name)) {
			out = append(out, line...)
			if line[len(line)-1] != '\n' {
				out = append(out, '\n')
			}
		}
	}
	return out, ok
}

// metricName is the metric name b starts with: its longest prefix of
// [a-zA-Z0-9_:], where expfmt stops reading a name.
func metricName(b []byte) []byte {
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == ':') {
			return b[:i]
		}
	}
	return b
}

// token splits b at its first blank (space, tab or newline).
func token(b []byte) (tok, rest []byte) {
	if i := bytes.IndexAny(b, " \t\n"); i >= 0 {
		return b[:i], b[i:]
	}
	return b, nil
}

// ParseText runs expfmt's text parser, turning its panics into errors: the
// v0.62.0 parser dereferences nil on a line starting with "{" after a
// comment (found by FuzzParseMetrics; input in testdata/fuzz). Every
// parser of a Prometheus exposition here goes through it (kube-proxy's,
// the kubelet's).
func ParseText(r io.Reader) (fams map[string]*dto.MetricFamily, err error) {
	defer func() {
		if p := recover(); p != nil {
			fams, err = nil, fmt.Errorf("parse metrics: parser panicked on malformed input: %v", p)
		}
	}()
	var p expfmt.TextParser
	fams, err = p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	return fams, nil
}

func ptr(v float64) *float64 { return &v }

func label(s *dto.Metric, name string) (string, bool) {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue(), true
		}
	}
	return "", false
}

func value(t dto.MetricType, s *dto.Metric) float64 {
	switch t {
	case dto.MetricType_COUNTER:
		return s.GetCounter().GetValue()
	case dto.MetricType_GAUGE:
		return s.GetGauge().GetValue()
	default:
		return s.GetUntyped().GetValue()
	}
}

// HistogramOf converts a parsed histogram sample: its finite buckets
// sorted by bound (+Inf is implied by Count; a NaN bound is no bucket).
func HistogramOf(h *dto.Histogram) *Histogram {
	out := &Histogram{Count: h.GetSampleCount(), Sum: h.GetSampleSum()}
	for _, b := range h.GetBucket() {
		if math.IsInf(b.GetUpperBound(), 1) || math.IsNaN(b.GetUpperBound()) {
			continue // implied by Count; or no bound at all
		}
		out.Buckets = append(out.Buckets, Bucket{UpperBound: b.GetUpperBound(), CumulativeCount: b.GetCumulativeCount()})
	}
	sort.Slice(out.Buckets, func(i, j int) bool { return out.Buckets[i].UpperBound < out.Buckets[j].UpperBound })
	return out
}
