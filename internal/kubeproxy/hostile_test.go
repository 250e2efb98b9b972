package kubeproxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestRedirectsNotFollowed: a 302 from the metrics or healthz URL was
// followed and the target's body (a fake secret) quoted into the finding
// and the Node condition (issue 13).
func TestRedirectsNotFollowed(t *testing.T) {
	var secretHits atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/secret", func(w http.ResponseWriter, r *http.Request) {
		secretHits.Add(1)
		fmt.Fprint(w, "TOKEN=hunter2-very-secret")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/secret", http.StatusFound) })
	ts := httptest.NewServer(mux)
	defer ts.Close()
	c, err := New(Options{MetricsURL: ts.URL + "/metrics", HealthzURL: ts.URL + "/healthz", ProxyModeURL: ts.URL + "/proxyMode", CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	_, merr := c.Metrics(ctx)
	_, herr := c.Healthz(ctx)
	_, perr := c.ProxyMode(ctx)
	for _, err := range []error{merr, herr, perr} {
		if err == nil || !strings.Contains(err.Error(), `HTTP 302 redirect to "/secret" not followed`) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("err = %v", err)
		}
	}
	if n := secretHits.Load(); n != 0 {
		t.Errorf("redirect target fetched %d times", n)
	}
}

// TestBodyExcerptSanitised: a body is quoted only as a short excerpt with
// control characters (terminal escapes, newlines) replaced.
func TestBodyExcerptSanitised(t *testing.T) {
	body := "\x1b[2J\x1b[31mnot json\n" + strings.Repeat("x", 1<<20)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprint(w, body)
	}))
	defer ts.Close()
	c, err := New(Options{MetricsURL: ts.URL + "/m", HealthzURL: ts.URL + "/h", ProxyModeURL: ts.URL + "/p", CacheTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Metrics(context.Background())
	if err == nil || strings.ContainsAny(err.Error(), "\x1b\n") || len(err.Error()) > 300 || !strings.Contains(err.Error(), `".[2J.[31mnot json.xxx`) {
		t.Errorf("err = %q (%d bytes)", err, len(err.Error()))
	}
}

// TestFamilyCardinality: 20,000 ip_family values became 40k findings and
// 377 MB (issue 13); 100k healthz status keys 424 MB. Only IPv4 and IPv6
// are kept; the rest are counted.
func TestFamilyCardinality(t *testing.T) {
	var b strings.Builder
	b.WriteString("# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge\n")
	for i := 0; i < 20000; i++ {
		fmt.Fprintf(&b, "kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"f%d\"} 1\n", i)
	}
	b.WriteString("kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family=\"IPv4\"} 1\n")
	m, err := ParseMetrics(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Families) != 1 || m.Families["IPv4"] == nil || m.IgnoredFamilies != 20000 {
		t.Errorf("families = %v, ignored %d", m.FamilyNames(), m.IgnoredFamilies)
	}
	var h strings.Builder
	h.WriteString(`{"lastUpdated":"2026-11-23T12:00:00Z","currentTime":"2026-11-23T12:00:01Z","healthy":false,"status":{"IPv6":{"healthy":false}`)
	for i := 0; i < 100000; i++ {
		fmt.Fprintf(&h, `,"k%d":{"healthy":false}`, i)
	}
	h.WriteString("}}")
	hz, err := ParseHealthz(503, []byte(h.String()))
	if err != nil {
		t.Fatal(err)
	}
	if len(hz.Families) != 1 || hz.IgnoredFamilies != 100000 || len(hz.UnhealthyFamilies()) != 1 {
		t.Errorf("healthz families = %v, ignored %d", hz.Families, hz.IgnoredFamilies)
	}
}
