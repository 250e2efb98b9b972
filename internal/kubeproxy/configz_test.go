package kubeproxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
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
		{"versioned lower-case keys", `{"kubeproxy.config.k8s.io":{"mode":"ipvs","clusterCIDR":"10.0.0.0/8","ipvs":{"syncPeriod":"1m0s","excludeCIDRs":["10.250.0.0/16"]}}}`,
			Configz{SyncPeriod: time.Minute, Mode: "ipvs", ClusterCIDR: "10.0.0.0/8", IPVSExcludeCIDRs: []string{"10.250.0.0/16"}}},
		// kube-proxy 1.34's /configz in IPVS mode (as served by the real
		// binary in TestVMKubeProxyIPVS, trimmed).
		{"1.34 IPVS excludeCIDRs", `{"kubeproxy.config.k8s.io":{"Mode":"ipvs","SyncPeriod":"10s","IPVS":{"Scheduler":"","ExcludeCIDRs":["10.96.200.0/24","fd00:200::/64"],"StrictARP":false}}}`,
			Configz{SyncPeriod: 10 * time.Second, Mode: "ipvs", IPVSExcludeCIDRs: []string{"10.96.200.0/24", "fd00:200::/64"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseConfigz([]byte(tc.body))
			if err != nil || !reflect.DeepEqual(*got, tc.want) {
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

func TestConfigzExcludedCIDRs(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want []netip.Prefix
		err  string
	}{
		{nil, []netip.Prefix{}, ""},
		{[]string{"10.96.200.0/24", "fd00:200::/64"}, []netip.Prefix{netip.MustParsePrefix("10.96.200.0/24"), netip.MustParsePrefix("fd00:200::/64")}, ""},
		// kube-proxy parses sloppily: leading zeros are decimal, host bits masked
		{[]string{"010.096.200.007/24"}, []netip.Prefix{netip.MustParsePrefix("10.96.200.0/24")}, ""},
		{[]string{"10.96.200.0/24", "soon"}, nil, "not a CIDR"},
		{[]string{"10.96.200.0"}, nil, "not a CIDR"},
	} {
		got, err := (&Configz{SyncPeriod: time.Second, IPVSExcludeCIDRs: tc.in}).ExcludedCIDRs()
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, %v; want error %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%q: %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	var big []string
	for i := 0; i <= MaxExcludeCIDRs; i++ {
		big = append(big, `"10.0.0.0/8"`)
	}
	cz, err := ParseConfigz([]byte(`{"kubeproxy.config.k8s.io":{"SyncPeriod":"1s","IPVS":{"ExcludeCIDRs":[` + strings.Join(big, ",") + `]}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cz.ExcludedCIDRs(); err == nil {
		t.Fatal("an over-long excludeCIDRs list was taken as complete")
	}
	if _, err := (*Configz)(nil).ExcludedCIDRs(); err == nil {
		t.Fatal("nil Configz gave exclusions")
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
	f.Add([]byte(`{"kubeproxy.config.k8s.io":{"Mode":"ipvs","SyncPeriod":"10s","IPVS":{"ExcludeCIDRs":["10.96.200.0/24","010.1.2.3/8","::/0"]}}}`))
	f.Add([]byte(`{"kubeproxy.config.k8s.io":{"mode":"ipvs","ipvs":{"syncPeriod":"1m","excludeCIDRs":["1.2.3.4/33"]}}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfigz(b)
		if err != nil {
			return
		}
		if c.SyncPeriod <= 0 {
			t.Fatalf("non-positive syncPeriod accepted: %+v", c)
		}
		ps, err := c.ExcludedCIDRs()
		if err == nil && len(ps) != len(c.IPVSExcludeCIDRs) {
			t.Fatalf("%d exclusions from %d entries", len(ps), len(c.IPVSExcludeCIDRs))
		}
		for _, p := range ps {
			if !p.IsValid() || p != p.Masked() {
				t.Fatalf("bad prefix %v", p)
			}
		}
	})
}
