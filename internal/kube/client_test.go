package kube

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	clientfeatures "k8s.io/client-go/features"
	"k8s.io/client-go/rest"
)

func TestRESTConfigNoAccess(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	_, err := RESTConfig("")
	if !IsNoAccess(err) || !strings.Contains(err.Error(), "no cluster access: not running in a pod") {
		t.Fatalf("got %v", err)
	}
	_, err = RESTConfig(filepath.Join(t.TempDir(), "missing"))
	if !IsNoAccess(err) || !strings.Contains(err.Error(), "--kubeconfig") {
		t.Fatalf("got %v", err)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	if err := os.WriteFile(bad, []byte("not: [yaml"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err = RESTConfig(bad); !IsNoAccess(err) {
		t.Fatalf("got %v", err)
	}
	good := filepath.Join(t.TempDir(), "good")
	if err := os.WriteFile(good, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := RESTConfig(good)
	if err != nil || cfg.Host != "https://127.0.0.1:6443" {
		t.Fatalf("got %v %v", cfg, err)
	}
}

func TestContactTracksReachability(t *testing.T) {
	code := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(code)
		_, _ = w.Write([]byte(`{"major":"1","minor":"34"}`))
	}))
	c, err := NewClient(&rest.Config{Host: srv.URL}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Contact.Reachable() {
		t.Fatal("reachable before any request")
	}
	if _, err := c.Interface.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if !c.Contact.Reachable() {
		t.Fatal("not reachable after success")
	}
	code = http.StatusServiceUnavailable
	_, _ = c.Interface.Discovery().ServerVersion()
	if c.Contact.Reachable() {
		t.Fatal("reachable after 503")
	}
	code = http.StatusOK
	if _, err := c.Interface.Discovery().ServerVersion(); err != nil || !c.Contact.Reachable() {
		t.Fatalf("not reachable after a success: %v", err)
	}
	// A throttling apiserver (429 on everything, no Retry-After: client-go
	// does not retry) answers nothing useful: a watch cannot be set up.
	code = http.StatusTooManyRequests
	_, _ = c.Interface.Discovery().ServerVersion()
	if c.Contact.Reachable() {
		t.Fatal("reachable after 429")
	}
	srv.Close()
	_, err = c.Interface.Discovery().ServerVersion()
	if st := c.Contact.Snapshot(); err == nil || st.LastError == nil || c.Contact.Reachable() {
		t.Fatalf("closed server: err=%v", err)
	}
}

// TestStreamingListGate: the daemon's call turns client-go's
// WatchListClient gate on unless KUBE_FEATURE_WatchListClient says
// otherwise (the environment is read once per process, so only the
// default is checked here); the previous gates are put back after.
func TestStreamingListGate(t *testing.T) {
	if _, set := os.LookupEnv(watchListEnv); set {
		t.Skipf("%s is set in this environment", watchListEnv)
	}
	if StreamingListEnabled() {
		t.Fatal("WatchListClient on before: client-go's default changed?")
	}
	prev := setStreamingList()
	defer clientfeatures.ReplaceFeatureGates(prev)
	if !StreamingListEnabled() {
		t.Fatal("WatchListClient is off after setStreamingList")
	}
	if !clientfeatures.FeatureGates().Enabled(clientfeatures.InformerResourceVersion) == prev.Enabled(clientfeatures.InformerResourceVersion) {
		t.Error("another gate changed")
	}
}
