package detect

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// Helpers that phrase the one figure a clean run judged (see Judged).

// lastSyncAges is "IPv4 last sync 4s ago, IPv6 last sync 5s ago".
func lastSyncAges(fams map[kubeproxy.Family]*kubeproxy.FamilyMetrics, now time.Time) string {
	var parts []string
	for _, f := range sortedFamilies(fams) {
		fm := fams[f]
		if fm.LastSync == nil {
			continue
		}
		age := now.Sub(seconds(*fm.LastSync)).Round(time.Second)
		name := string(f)
		if name == "" {
			name = "kube-proxy"
		}
		parts = append(parts, fmt.Sprintf("%s last sync %s ago", name, age))
	}
	if len(parts) == 0 {
		return "no sync timestamp in kube-proxy's metrics"
	}
	return strings.Join(parts, ", ")
}

func sortedFamilies(fams map[kubeproxy.Family]*kubeproxy.FamilyMetrics) []kubeproxy.Family {
	out := make([]kubeproxy.Family, 0, len(fams))
	for f := range fams {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// pct formats a ratio as a percentage.
func pct(r float64) string { return fmt.Sprintf("%.0f%%", r*100) }
