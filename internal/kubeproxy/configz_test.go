package kubeproxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestParseConfigz(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Configz
	}{
		{"1.34 internal config, top-level periods", `{"kubeproxy.config.k8s.io":{"Mode":"iptables","SyncPeriod":"10s","MinSyncPeriod":"1s","ClusterCIDR":"10.244.0.0/16,fd00::/48","IPTables":{"MasqueradeBit":14}}}`,
			Configz{SyncPeriod: 10 * time.Second, MinSyncPeriod: time.Second, Mode: "iptables", ClusterCIDR: "10.244.0.0/16,fd00::/48"}},
		{"older: per-mode periods", `{"kubeproxy.config.k8s.io":{"Mode":"nftables","IPTables":{"SyncPeriod":"30s"},"NFTables":{"SyncPeriod":"45s","MinSyncPeriod":"2s"}}}`,
			Configz{SyncPeriod: 45 * time.Second, MinSyncPeriod: 2 * time.Second, Mode: "nftables"}},
		{"versioned lower-case keys", `{"kubeproxy.config.k8s.io":{"mode":"ipvs","clusterCIDR":"10.0.0.0/8","ipvs":{"syncPeriod":"1m0s"}}}`,
			Configz{SyncPeriod: time.Minute, Mode: "ipvs", ClusterCIDR: "10.0.0.0/8"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfigz([]byte(tc.body))
			if err != nil || *got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
	for _, bad := range []string{``, `[]`, `{}`, `{"kubeproxy.config.k8s.io":{}}`, `{"kubeproxy.config.k8s.io":{"SyncPeriod":"-1s"}}`, `{"kubeproxy.config.k8s.io":{"SyncPeriod":"soon"}}`} {
		if c, err := ParseConfigz([]byte(bad)); err == nil {
			t.Errorf("%q parsed: %+v", bad, c)
		}
	}
}

func TestClientConfigz(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/configz" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"kubeproxy.config.k8s.io":{"Mode":"iptables","SyncPeriod":"10s"}}`))
	}))
	defer srv.Close()
	c, err := New(Options{MetricsURL: srv.URL + "/metrics", SyncPeriod: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if c.SyncPeriod() != 30*time.Second {
		t.Fatalf("before /configz: %v", c.SyncPeriod())
	}
	cz, err := c.Configz(context.Background())
	if err != nil || cz.SyncPeriod != 10*time.Second {
		t.Fatalf("%+v %v", cz, err)
	}
	if c.SyncPeriod() != 10*time.Second || c.ConfiguredSyncPeriod() != 30*time.Second {
		t.Fatalf("after /configz: %v (configured %v)", c.SyncPeriod(), c.ConfiguredSyncPeriod())
	}
}

func FuzzParseConfigz(f *testing.F) {
	f.Add([]byte(`{"kubeproxy.config.k8s.io":{"Mode":"iptables","SyncPeriod":"10s","MinSyncPeriod":"1s"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if c, err := ParseConfigz(b); err == nil && c.SyncPeriod <= 0 {
			t.Fatalf("non-positive syncPeriod accepted: %+v", c)
		}
	})
}
