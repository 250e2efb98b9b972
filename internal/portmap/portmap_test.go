package portmap

import (
	"net"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/nftables"
)

// portmapSave is the nat table as portmap 1.x leaves it for one pod
// (10.244.0.5) mapping hostPort 8080/tcp to 80 and 5353/udp to 53 on
// hostIP 192.0.2.10, beside kube-proxy's chains.
var portmapSave = testdataString("testdata/save.txt")

// flushedSave is the same nat table after a flush and kube-proxy's
// resync: kube-proxy's chains are back, portmap's are not.
var flushedSave = testdataString("testdata/flushed-save.txt")

// portmapNFT is portmap's nftables backend table for the same pod.
var portmapNFT = testdataString("testdata/nft.json")

func TestFromIPTables(t *testing.T) {
	rs, err := iptables.ParseString(portmapSave)
	if err != nil {
		t.Fatal(err)
	}
	got, present := FromIPTables(rs, iptables.IPv4, "iptables-nft")
	want := []DNAT{
		{Family: iptables.IPv4, Protocol: "tcp", HostPort: 8080, DestIP: "10.244.0.5", DestPort: 80, Source: "iptables-nft"},
		{Family: iptables.IPv4, Protocol: "udp", HostPort: 5353, HostIP: "192.0.2.10", DestIP: "10.244.0.5", DestPort: 53, Source: "iptables-nft"},
	}
	if !present || len(got) != len(want) {
		t.Fatalf("got %+v present=%v, want %+v", got, present, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("dnat %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// Unreachable: PREROUTING and OUTPUT no longer jump to CNI-HOSTPORT-DNAT.
	cut := strings.ReplaceAll(portmapSave, "-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n", "")
	cut = strings.ReplaceAll(cut, "-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT\n", "")
	rs, _ = iptables.ParseString(cut)
	if got, present := FromIPTables(rs, iptables.IPv4, "x"); len(got) != 0 || !present {
		t.Errorf("unreachable chain: got %+v present=%v, want none, present", got, present)
	}
	rs, _ = iptables.ParseString(flushedSave)
	if got, present := FromIPTables(rs, iptables.IPv4, "x"); len(got) != 0 || present {
		t.Errorf("flushed: got %+v present=%v", got, present)
	}
	// IPv6 destination.
	d, ok := parseDNATRule(strings.Fields("-p tcp -m tcp --dport 8080 -j DNAT --to-destination [fd00::5]:80"), "DNAT")
	if !ok || d.DestIP != "fd00::5" || d.DestPort != 80 {
		t.Errorf("v6: %+v %v", d, ok)
	}
	for _, bad := range []string{"-p tcp ! --dport 8080 -j DNAT --to-destination 10.0.0.1:80", "-p tcp --dport 8080:8090 -j DNAT --to-destination 10.0.0.1:80",
		"-p tcp --dport 8080 -j DNAT --to-destination 10.0.0.1-10.0.0.3:80", "-p tcp --dport 8080 -j DNAT"} {
		if d, ok := parseDNATRule(strings.Fields(bad), "DNAT"); ok {
			t.Errorf("%q parsed as %+v", bad, d)
		}
	}
}

func TestFromNFT(t *testing.T) {
	rs, err := nftables.ParseString(portmapNFT)
	if err != nil {
		t.Fatal(err)
	}
	got := FromNFT(rs.Table(nftables.FamilyIP, "cni_hostport"), iptables.IPv4)
	if len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	byPort := map[int32]DNAT{}
	for _, d := range got {
		byPort[d.HostPort] = d
	}
	if d := byPort[8080]; d.Protocol != "tcp" || d.DestIP != "10.244.0.5" || d.DestPort != 80 || d.HostIP != "" {
		t.Errorf("8080: %+v", d)
	}
	if d := byPort[5353]; d.Protocol != "udp" || d.DestPort != 53 || d.HostIP != "192.0.2.10" {
		t.Errorf("5353: %+v", d)
	}
}

func FuzzFromIPTables(f *testing.F) {
	f.Add(portmapSave)
	f.Add(flushedSave)
	f.Fuzz(func(t *testing.T, text string) {
		rs, err := iptables.ParseString(text)
		if err != nil {
			return
		}
		for _, d := range mustDNATs(FromIPTables(rs, iptables.IPv6, "x")) {
			if d.HostPort <= 0 || d.DestPort <= 0 || net.ParseIP(d.DestIP) == nil || d.Protocol == "" {
				t.Fatalf("bad DNAT %+v", d)
			}
		}
	})
}

func mustDNATs(d []DNAT, _ bool) []DNAT { return d }

func FuzzFromNFT(f *testing.F) {
	f.Add(portmapNFT)
	f.Fuzz(func(t *testing.T, doc string) {
		rs, err := nftables.ParseString(doc)
		if err != nil {
			return
		}
		for _, tb := range rs.Tables {
			for _, d := range FromNFT(tb, iptables.IPv4) {
				if d.HostPort <= 0 || d.DestPort <= 0 || net.ParseIP(d.DestIP) == nil || d.Protocol == "" {
					t.Fatalf("bad DNAT %+v", d)
				}
			}
		}
	})
}
