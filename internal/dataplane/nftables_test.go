package dataplane

import (
	"os"
	"testing"

	"github.com/remediate-dev/remediate/internal/nftables"
)

// The real capture of kube-proxy v1.34.4 in nftables mode (internal/nftables
// testdata): default/kubernetes, nft-capture/web (http, dns), a NodePort
// Service np and a Service without endpoints, empty.
func TestFromNFTablesRealCapture(t *testing.T) {
	b, err := os.ReadFile("../nftables/testdata/kube-proxy-v1.34.4-ruleset.json")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := nftables.ParseBytes(b)
	if err != nil {
		t.Fatal(err)
	}
	st := FromNFTables(rs.Table(nftables.FamilyIP, nftables.KubeProxyTableName), IPv4)
	equalLines(t, entries(st), []string{
		"default/kubernetes:https ClusterIP TCP/10.96.0.1:443 forward [10.200.0.1:6443]",
		"nft-capture/empty:http ClusterIP TCP/10.96.219.213:80 reject []",
		"nft-capture/np:http ClusterIP TCP/10.96.241.69:80 forward [10.244.0.7:8080]",
		"nft-capture/np:http NodePort TCP/nodePort:32095 forward [10.244.0.7:8080]",
		"nft-capture/web:dns ClusterIP UDP/10.96.172.238:53 forward [10.244.0.5:53 10.244.0.6:53]",
		"nft-capture/web:http ClusterIP TCP/10.96.172.238:80 forward [10.244.0.5:8080 10.244.0.6:8080]",
	})
	if len(st.Notes) > 0 {
		t.Errorf("notes: %v", st.Notes)
	}
	if st6 := FromNFTables(rs.Table(nftables.FamilyIP6, nftables.KubeProxyTableName), IPv6); len(st6.Ports) != 0 {
		t.Logf("ip6: %v", entries(st6))
	}
	if FromNFTables(nil, IPv4).Ports == nil {
		t.Fatal("nil table")
	}
}

func FuzzFromNFTables(f *testing.F) {
	b, err := os.ReadFile("../nftables/testdata/kube-proxy-v1.34.4-ruleset.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, doc []byte) {
		rs, err := nftables.ParseBytes(doc)
		if err != nil {
			return
		}
		for _, fam := range []nftables.Family{nftables.FamilyIP, nftables.FamilyIP6} {
			st := FromNFTables(rs.Table(fam, nftables.KubeProxyTableName), IPv4)
			for _, sp := range st.Ports {
				for _, e := range sp.Entries {
					if e.Verdict != Forward && len(e.Backends) > 0 {
						t.Fatalf("non-forward entry with backends: %+v", e)
					}
				}
			}
		}
	})
}
