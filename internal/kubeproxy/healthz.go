package kubeproxy

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Healthz formats.
const (
	// FormatPerFamily is the 1.33+ body: RFC 3339 times, "healthy" and a
	// per-family "status" object.
	FormatPerFamily = "per-family"
	// FormatLegacy is the 1.30-1.32 body: times in Go's time.Time.String()
	// form, no per-family status; health is the HTTP status code.
	FormatLegacy = "legacy"
)

// FamilyHealth is one family's entry in a 1.33+ /healthz body.
type FamilyHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

// Healthz is one parsed answer of kube-proxy's /healthz.
type Healthz struct {
	// StatusCode is the HTTP status (200 healthy, 503 unhealthy).
	StatusCode int `json:"statusCode"`
	// Format is FormatPerFamily or FormatLegacy.
	Format string `json:"format"`
	// Healthy is the body's "healthy" field (1.33+) or, for the legacy
	// format, StatusCode == 200.
	Healthy bool `json:"healthy"`
	// NodeEligible is false when the Node is being deleted or is tainted
	// ToBeDeletedByClusterAutoscaler: kube-proxy then answers 503 on
	// purpose, which is not a kube-proxy fault. Nil when absent (livez).
	NodeEligible *bool `json:"nodeEligible,omitempty"`
	// LastUpdated and CurrentTime are as reported (kube-proxy's clock).
	LastUpdated time.Time `json:"lastUpdated"`
	CurrentTime time.Time `json:"currentTime"`
	// Families is the per-family status (1.33+ only).
	Families map[Family]FamilyHealth `json:"families,omitempty"`
	// IgnoredFamilies counts status keys other than IPv4 and IPv6, which
	// are ignored.
	IgnoredFamilies int `json:"ignoredFamilies,omitempty"`
}

// UnhealthyFamilies returns the families reported unhealthy, sorted. For the
// legacy format an unhealthy answer from an eligible node yields
// [Unlabelled].
func (h *Healthz) UnhealthyFamilies() []Family {
	var out []Family
	if h.Format == FormatPerFamily {
		for f, s := range h.Families {
			if !s.Healthy {
				out = append(out, f)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		if len(out) == 0 && !h.Healthy && (h.NodeEligible == nil || *h.NodeEligible) {
			// Unhealthy overall with no family named: report it as a whole.
			out = []Family{Unlabelled}
		}
		return out
	}
	if !h.Healthy && (h.NodeEligible == nil || *h.NodeEligible) {
		return []Family{Unlabelled}
	}
	return nil
}

type rawHealthz struct {
	LastUpdated  *string                    `json:"lastUpdated"`
	CurrentTime  *string                    `json:"currentTime"`
	NodeEligible *bool                      `json:"nodeEligible"`
	Healthy      *bool                      `json:"healthy"`
	Status       map[string]json.RawMessage `json:"status"`
}

// ParseHealthz parses a /healthz (or /livez) answer. Status codes other than
// 200 and 503 and bodies that are not one of the two known formats are
// errors.
func ParseHealthz(statusCode int, body []byte) (*Healthz, error) {
	if statusCode != 200 && statusCode != 503 {
		return nil, fmt.Errorf("unexpected HTTP status %d", statusCode)
	}
	var raw rawHealthz
	if err := json.Unmarshal(body, &raw); err != nil {
		return nil, fmt.Errorf("parse healthz body: %w", err)
	}
	if raw.LastUpdated == nil || raw.CurrentTime == nil {
		return nil, fmt.Errorf("healthz body lacks lastUpdated/currentTime")
	}
	h := &Healthz{StatusCode: statusCode, NodeEligible: raw.NodeEligible}
	var err error
	if h.LastUpdated, err = parseTime(*raw.LastUpdated); err != nil {
		return nil, fmt.Errorf("healthz lastUpdated: %w", err)
	}
	if h.CurrentTime, err = parseTime(*raw.CurrentTime); err != nil {
		return nil, fmt.Errorf("healthz currentTime: %w", err)
	}
	if raw.Healthy == nil {
		h.Format = FormatLegacy
		h.Healthy = statusCode == 200
		return h, nil
	}
	h.Format = FormatPerFamily
	h.Healthy = *raw.Healthy
	h.Families = map[Family]FamilyHealth{}
	for name, msg := range raw.Status {
		if !KnownFamily(name) {
			h.IgnoredFamilies++
			continue
		}
		var s struct {
			LastUpdated string `json:"lastUpdated"`
			Healthy     *bool  `json:"healthy"`
		}
		if err := json.Unmarshal(msg, &s); err != nil {
			return nil, fmt.Errorf("healthz status %q: %w", name, err)
		}
		if s.Healthy == nil {
			return nil, fmt.Errorf("healthz status %q lacks healthy", name)
		}
		fh := FamilyHealth{Healthy: *s.Healthy}
		if s.LastUpdated != "" {
			if fh.LastUpdated, err = parseTime(s.LastUpdated); err != nil {
				return nil, fmt.Errorf("healthz status %q lastUpdated: %w", name, err)
			}
		}
		h.Families[Family(name)] = fh
	}
	return h, nil
}

// goTimeLayout is time.Time.String()'s layout, without the monotonic
// reading (" m=+12.345") it appends for times from time.Now().
const goTimeLayout = "2006-01-02 15:04:05.999999999 -0700 MST"

// parseTime accepts RFC 3339 (1.33+) and Go's time.Time.String() form
// (1.30-1.32: "2026-11-21 11:38:39.66 +0000 UTC m=+0.00").
func parseTime(s string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	if i := strings.Index(s, " m="); i >= 0 {
		s = s[:i]
	}
	t, err := time.Parse(goTimeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("time %q is neither RFC 3339 nor Go's time.Time.String() form", s)
	}
	return t, nil
}
