package cluster

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestFreshnessUsable(t *testing.T) {
	now := time.Date(2026, 11, 25, 18, 0, 0, 0, time.UTC)
	boom := errors.New("GET /api/v1/services: HTTP 429")
	for _, tc := range []struct {
		name       string
		f          Freshness
		note, skip string // substrings; "" means empty
	}{
		{name: "connected", f: Freshness{Synced: true, Connected: true, CurrentAt: now}},
		{name: "unsynced", f: Freshness{Connected: true}, skip: "not synced"},
		{name: "over budget", f: Freshness{Synced: true, Connected: true, OverBudget: "cluster view over its memory budget (--cluster-view-memory 1Mi)"},
			skip: "--cluster-view-memory 1Mi"},
		{name: "young", f: Freshness{Synced: true, LastError: boom, CurrentAt: now.Add(-40 * time.Second), MaxAge: 2 * time.Minute},
			note: "cluster view 40s old (API server unreachable: GET /api/v1/services: HTTP 429; used up to 2m0s)"},
		{name: "too old", f: Freshness{Synced: true, LastError: boom, CurrentAt: now.Add(-3 * time.Minute), MaxAge: 2 * time.Minute},
			skip: "cluster view 3m0s old, older than its 2m0s limit (API server unreachable: GET /api/v1/services: HTTP 429)"},
		{name: "age unknown", f: Freshness{Synced: true, LastError: boom, MaxAge: time.Hour}, skip: "its age unknown"},
		{name: "no max age", f: Freshness{Synced: true, CurrentAt: now}, skip: "0s old, older than its 0s limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			note, skip := tc.f.Usable(now.Add(0))
			if tc.name == "no max age" {
				note, skip = tc.f.Usable(now.Add(time.Second))
				tc.skip = "1s old, older than its 0s limit"
			}
			check := func(what, got, want string) {
				if (want == "") != (got == "") || !strings.Contains(got, want) {
					t.Errorf("%s = %q, want %q", what, got, want)
				}
			}
			check("note", note, tc.note)
			check("skip", skip, tc.skip)
		})
	}
}

func TestFreshnessAge(t *testing.T) {
	now := time.Now()
	if a := (Freshness{Connected: true}).Age(now); a != 0 {
		t.Errorf("connected: %s", a)
	}
	if a := (Freshness{}).Age(now); a != -1 {
		t.Errorf("unknown: %s", a)
	}
	if a := (Freshness{CurrentAt: now.Add(-time.Minute)}).Age(now); a != time.Minute {
		t.Errorf("a minute: %s", a)
	}
	if a := (Freshness{CurrentAt: now.Add(time.Minute)}).Age(now); a != 0 {
		t.Errorf("ahead: %s", a)
	}
}
