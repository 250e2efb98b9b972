//go:build linux

package iptables

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/internal/nfnetlink"
)

// readNS reads the IPv4 legacy tables of a test namespace.
func readNS(t testing.TB, ns string) ([]LegacyTableInfo, [][]byte) {
	t.Helper()
	var infos []LegacyTableInfo
	var blobs [][]byte
	err := nfnetlink.InNetNS(netnsPath(ns), func() error {
		var err error
		infos, blobs, err = readLegacyTables()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return infos, blobs
}

// saveNS runs iptables-legacy-save in the namespace and parses it.
func saveNS(t testing.TB, ns string) *Ruleset {
	t.Helper()
	rs, err := ParseString(netnstest.Run(t, ns, "", "iptables-legacy-save"))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// diffTokens compares two rule sets token for token, line numbers
// included, and returns the first differences.
func diffTokens(want, got *Ruleset) []string {
	var d []string
	add := func(f string, a ...any) {
		if len(d) < 10 {
			d = append(d, fmt.Sprintf(f, a...))
		}
	}
	if len(want.Tables) != len(got.Tables) {
		add("%d tables, want %d", len(got.Tables), len(want.Tables))
		return d
	}
	for i, wt := range want.Tables {
		gt := got.Tables[i]
		if wt.Name != gt.Name || len(wt.Chains) != len(gt.Chains) {
			add("table %d: %s with %d chains, want %s with %d", i, gt.Name, len(gt.Chains), wt.Name, len(wt.Chains))
			continue
		}
		for j, wc := range wt.Chains {
			gc := gt.Chains[j]
			if wc.Name != gc.Name || wc.Policy != gc.Policy || len(wc.Rules) != len(gc.Rules) {
				add("%s chain %d: %s %s (%d rules), want %s %s (%d rules)", wt.Name, j, gc.Name, gc.Policy, len(gc.Rules), wc.Name, wc.Policy, len(wc.Rules))
				continue
			}
			if gt.Chain(wc.Name) != gc {
				add("%s: chain %s not indexed", wt.Name, wc.Name)
			}
			for k, wr := range wc.Rules {
				gr := gc.Rules[k]
				if !slices.Equal(wr.Args, gr.Args) || wr.Target != gr.Target || wr.Goto != gr.Goto || wr.Line != gr.Line {
					add("%s %s rule %d:\n  got  %d %q (%s %v)\n  want %d %q (%s %v)", wt.Name, wc.Name, k+1,
						gr.Line, gr.Args, gr.Target, gr.Goto, wr.Line, wr.Args, wr.Target, wr.Goto)
				}
			}
		}
	}
	return d
}

// checkDecodeEqualsSave decodes the namespace's legacy tables and compares
// them with its iptables-legacy-save, parsed, and both canonical models.
func checkDecodeEqualsSave(t *testing.T, ns string) *Ruleset {
	t.Helper()
	infos, blobs := readNS(t, ns)
	got, err := DecodeLegacy(infos, blobs)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	want := saveNS(t, ns)
	if d := diffTokens(want, got); len(d) > 0 {
		t.Fatalf("decode differs from iptables-legacy-save:\n%s", strings.Join(d, "\n"))
	}
	if w, g := want.String(), got.String(); w != g {
		t.Fatalf("formatted decode differs from the save")
	}
	return got
}

// addNfacct creates a nfnetlink_acct object in the namespace (what
// kube-proxy does for its nfacct matches).
func addNfacct(t testing.TB, ns, name string) {
	t.Helper()
	err := nfnetlink.InNetNS(netnsPath(ns), func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		ae := netlink.NewAttributeEncoder()
		ae.String(1, name) // NFACCT_NAME
		attrs, err := ae.Encode()
		if err != nil {
			return err
		}
		_, err = c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(7 << 8), // NFNL_SUBSYS_ACCT, NFNL_MSG_ACCT_NEW
				Flags: netlink.Request | netlink.Create | netlink.Acknowledge},
			Data: append([]byte{unix.AF_UNSPEC, 0, 0, 0}, attrs...),
		})
		return err
	})
	if err != nil {
		t.Fatalf("nfacct %s: %v", name, err)
	}
}

// TestRealDecodeKubeProxyFixture: the captured kube-proxy v1.34.4 rules
// (with their nfacct rule: the accounting object is made first), restored
// with iptables-legacy-restore into a namespace, decode from the kernel's
// entries to exactly what iptables-legacy-save prints, line numbers
// included, and to the same canonical model.
func TestRealDecodeKubeProxyFixture(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-legacy-save")
	t.Setenv("XTABLES_LOCKFILE", t.TempDir()+"/xtables.lock")
	addNfacct(t, ns, "ct_state_invalid_dropped_pkts")
	rs, _ := loadFixture(t)
	netnstest.Run(t, ns, rs.String(), "iptables-legacy-restore", "-w", "5")
	got := checkDecodeEqualsSave(t, ns)
	if !equalRulesets(rs, got) {
		t.Fatalf("decode differs from the restored fixture:\n%s", got.String())
	}
	if _, _, ok := got.Table("filter").Chain("KUBE-FORWARD").Rules[0].Match("nfacct", "--nfacct-name"); !ok {
		t.Errorf("nfacct rule not decoded: %q", got.Table("filter").Chain("KUBE-FORWARD").Rules[0].Args)
	}
}

// decodeVariants are rules with every option of every decoded extension
// (and the entry header's fields) that the decoder prints, in the forms
// kube-proxy and CNIs write and a few more.
const decodeVariants = `*mangle
:PREROUTING DROP [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:CNI-A - [0:0]
-A FORWARD -i eth0 -o veth+ -j CNI-A
-A FORWARD ! -i lo ! -o a12345678901234 -j ACCEPT
-A FORWARD -i + -o x+ -j ACCEPT
-A PREROUTING -s 10.1.0.0/255.0.255.0 ! -d 0.0.0.0/0 -j RETURN
-A PREROUTING ! -p tcp -f -j DROP
-A PREROUTING -p icmp ! -f
-A PREROUTING -p sctp -m sctp --sport 1:2 ! --dport 3
-A PREROUTING -p sctp -m sctp ! --sport 7
-A PREROUTING -p tcp -m tcp ! --sport 10:20 ! --dport 30
-A PREROUTING -p udp -m udp --sport 5 --dport 0:1023
-A PREROUTING -m mark --mark 0x1 -m mark ! --mark 0x0/0xff00
-A PREROUTING -m conntrack --ctstate INVALID,NEW,RELATED,ESTABLISHED,UNTRACKED,SNAT,DNAT
-A PREROUTING -m conntrack ! --ctstate NEW
-A PREROUTING -m statistic --mode random --probability 0.33333333349 -m statistic --mode random ! --probability 1.00000000000
-A PREROUTING -m statistic --mode nth --every 3 --packet 2 -m statistic --mode nth ! --every 1 --packet 0
-A PREROUTING -m statistic --mode random --probability 0.00000000047
-A PREROUTING -m addrtype --src-type UNSPEC,UNICAST,LOCAL,BROADCAST,ANYCAST,MULTICAST,BLACKHOLE,UNREACHABLE,PROHIBIT,THROW,NAT,XRESOLVE ! --dst-type LOCAL --limit-iface-in
-A OUTPUT -m addrtype ! --src-type LOCAL --limit-iface-out
-A PREROUTING -m comment --comment "a \"quoted\" 'comment' with \\ and spaces" -m comment --comment plain_-09 -m comment --comment ""
-A PREROUTING -m recent --set --name KUBE-SEP-ABC --mask 255.255.255.255 --rsource
-A PREROUTING -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-ABC --mask 255.255.255.255 --rsource -j ACCEPT
-A PREROUTING -m recent ! --update --hitcount 2 --rttl --name x --mask 255.255.0.0 --rdest
-A PREROUTING -m recent --remove --name y --mask 0.0.0.0 --rsource
-A PREROUTING -j MARK --set-xmark 0x4000/0x4000
-A PREROUTING -j MARK --set-xmark 0x1/0xffffffff
-A PREROUTING -j MARK --set-xmark 0x0/0x0
-A PREROUTING -g CNI-A
-A CNI-A -j RETURN
COMMIT
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-A - [0:0]
:KUBE-B - [0:0]
-A PREROUTING -j KUBE-B
-A OUTPUT -p tcp -j DNAT --to-destination 10.0.0.1:80
-A OUTPUT -j DNAT --to-destination 10.0.0.2
-A OUTPUT -p udp -j DNAT --to-destination 10.0.0.3:53 --random
-A OUTPUT -p tcp -j DNAT --to-destination 10.0.0.4:1 --persistent
-A POSTROUTING -j MASQUERADE
-A POSTROUTING -j MASQUERADE --random
-A POSTROUTING -j MASQUERADE --random-fully
-A KUBE-A -j KUBE-B
COMMIT
*filter
:INPUT ACCEPT [0:0]
:FORWARD DROP [0:0]
:OUTPUT ACCEPT [0:0]
:KUBE-EMPTY - [0:0]
-A INPUT -j KUBE-EMPTY
-A INPUT -p tcp -j REJECT --reject-with icmp-port-unreachable
-A INPUT -j REJECT --reject-with icmp-net-unreachable
-A INPUT -j REJECT --reject-with icmp-host-unreachable
-A INPUT -j REJECT --reject-with icmp-proto-unreachable
-A INPUT -j REJECT --reject-with icmp-net-prohibited
-A INPUT -j REJECT --reject-with icmp-host-prohibited
-A INPUT -p tcp -j REJECT --reject-with tcp-reset
-A INPUT -j REJECT --reject-with icmp-admin-prohibited
-A FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name acct_1 -j DROP
COMMIT
`

// TestRealDecodeEveryOption: rules using every option the decoder prints,
// restored into a namespace, decode to exactly iptables-legacy-save's
// output; rules with an extension or option it does not print are not
// decodable (the caller saves instead).
func TestRealDecodeEveryOption(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-legacy-save", "iptables-legacy")
	t.Setenv("XTABLES_LOCKFILE", t.TempDir()+"/xtables.lock")
	addNfacct(t, ns, "acct_1")
	netnstest.Run(t, ns, decodeVariants, "iptables-legacy-restore", "-w", "5")
	got := checkDecodeEqualsSave(t, ns)
	if n := got.RuleCount(); n < 45 {
		t.Fatalf("%d rules decoded", n)
	}
	// Each of these, added alone, makes its table not decodable.
	for _, rule := range [][]string{
		{"-t", "filter", "-A", "INPUT", "-p", "tcp", "-m", "multiport", "--dports", "1,2"},
		{"-t", "filter", "-A", "INPUT", "-p", "tcp", "-m", "tcp", "--tcp-flags", "SYN", "SYN"},
		{"-t", "filter", "-A", "INPUT", "-m", "conntrack", "--ctproto", "tcp"},
		{"-t", "filter", "-A", "INPUT", "-m", "state", "--state", "NEW"},
		{"-t", "filter", "-A", "INPUT", "-p", "47"},
		{"-t", "filter", "-A", "INPUT", "-j", "LOG"},
		{"-t", "nat", "-A", "OUTPUT", "-p", "tcp", "-j", "DNAT", "--to-destination", "10.0.0.1-10.0.0.2:80"},
		{"-t", "nat", "-A", "POSTROUTING", "-p", "tcp", "-j", "MASQUERADE", "--to-ports", "1000"},
		{"-t", "nat", "-A", "POSTROUTING", "-j", "SNAT", "--to-source", "10.0.0.1"},
	} {
		netnstest.Run(t, ns, "", append([]string{"iptables-legacy", "-w", "5"}, rule...)...)
		infos, blobs := readNS(t, ns)
		if rs, err := DecodeLegacy(infos, blobs); !errors.Is(err, ErrNotDecodable) {
			t.Errorf("%q: decode error %v, want not decodable; decoded:\n%v", rule, err, rs)
		}
		del := slices.Clone(rule)
		del[2] = "-D"
		netnstest.Run(t, ns, "", append([]string{"iptables-legacy", "-w", "5"}, del...)...)
	}
	checkDecodeEqualsSave(t, ns)
}

// TestRealSaveDecodesInsteadOfSaving: the adapter with a change check
// (NetNS) returns the decode of the legacy IPv4 entries it read, equal to
// the save, and runs no save; entries it cannot decode (a multiport
// match) make it run the save (DecodeFallback says why, counted, logged
// once) with the save's rules; NoDecode always saves.
func TestRealSaveDecodesInsteadOfSaving(t *testing.T) {
	ns := netnstest.New(t)
	netnstest.NeedCommands(t, "iptables-legacy-restore", "iptables-legacy-save", "iptables-legacy")
	t.Setenv("XTABLES_LOCKFILE", t.TempDir()+"/xtables.lock")
	rs := restorable(t)
	netnstest.Run(t, ns, rs.String(), "iptables-legacy-restore", "-w", "5")
	var logged []string
	r := New(Config{Prefix: netnstest.Prefix(ns), NetNS: netnsPath(ns), Timeout: 20 * time.Second,
		Log: func(f Family, reason string) { logged = append(logged, string(f)+": "+reason) }})
	ctx := context.Background()
	reads := func() Reads {
		for _, x := range r.Reads() {
			if x.Family == IPv4 && x.Backend == Legacy {
				return x
			}
		}
		return Reads{}
	}
	s, err := r.Save(ctx, IPv4, Legacy)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Decoded || s.Reused || s.DecodeFallback != "" || s.Duration <= 0 || s.Bytes != 0 {
		t.Errorf("first Save: decoded %v reused %v fallback %q duration %v bytes %d", s.Decoded, s.Reused, s.DecodeFallback, s.Duration, s.Bytes)
	}
	if d := diffTokens(saveNS(t, ns), s.Rules); len(d) > 0 {
		t.Fatalf("decoded snapshot differs from the save:\n%s", strings.Join(d, "\n"))
	}
	if got := reads(); got.Saves != 0 || got.Decodes != 1 {
		t.Errorf("reads %+v, want 1 decode, no save", got)
	}
	if s, err := r.Save(ctx, IPv4, Legacy); err != nil || !s.Reused || !s.Decoded {
		t.Errorf("unchanged: reused %v decoded %v err %v", s.Reused, s.Decoded, err)
	}

	// Not decodable: the save runs, twice (two changes), logged once.
	for _, port := range []string{"1,2", "3,4"} {
		netnstest.Run(t, ns, "", "iptables-legacy", "-w", "5", "-t", "filter", "-A", "INPUT", "-p", "tcp", "-m", "multiport", "--dports", port, "-j", "ACCEPT")
		s, err = r.Save(ctx, IPv4, Legacy)
		if err != nil {
			t.Fatal(err)
		}
		if s.Decoded || !strings.Contains(s.DecodeFallback, "match multiport") || s.Bytes == 0 {
			t.Errorf("multiport: decoded %v fallback %q bytes %d", s.Decoded, s.DecodeFallback, s.Bytes)
		}
		if d := diffTokens(saveNS(t, ns), s.Rules); len(d) > 0 {
			t.Fatalf("fallback snapshot differs from the save:\n%s", strings.Join(d, "\n"))
		}
	}
	if got := reads(); got.Saves != 2 || got.Decodes != 1 || got.DecodeFallbacks != 2 {
		t.Errorf("reads %+v, want 2 saves, 1 decode, 2 fallbacks", got)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "IPv4: ") || !strings.Contains(logged[0], "multiport") {
		t.Errorf("logged %q, want one fallback line", logged)
	}

	// NoDecode: the save runs.
	off := New(Config{Prefix: netnstest.Prefix(ns), NetNS: netnsPath(ns), Timeout: 20 * time.Second, NoDecode: true})
	netnstest.Run(t, ns, "", "iptables-legacy", "-w", "5", "-t", "filter", "-D", "INPUT", "-p", "tcp", "-m", "multiport", "--dports", "1,2", "-j", "ACCEPT")
	netnstest.Run(t, ns, "", "iptables-legacy", "-w", "5", "-t", "filter", "-D", "INPUT", "-p", "tcp", "-m", "multiport", "--dports", "3,4", "-j", "ACCEPT")
	if s, err := off.Save(ctx, IPv4, Legacy); err != nil || s.Decoded || s.DecodeFallback != "" || s.Bytes == 0 {
		t.Errorf("NoDecode: decoded %v fallback %q err %v", s.Decoded, s.DecodeFallback, err)
	}
}

// benchDecode compares, on one legacy IPv4 rule set restored into a
// namespace, what a changed table costs the adapter: decode (the
// IPT_SO_GET_ENTRIES read and hash the change check makes anyway, plus
// DecodeLegacy), decode-only (DecodeLegacy of blobs already read: what the
// decode adds to the cycle) against save (running iptables-legacy-save,
// as Save did, plus ParseString). cpu-ms/op counts this process and its children (the
// save command). Root only.
func benchDecode(b *testing.B, text string, nfacct ...string) {
	ns := netnstest.New(b)
	netnstest.NeedCommands(b, "iptables-legacy-restore", "iptables-legacy-save")
	b.Setenv("XTABLES_LOCKFILE", b.TempDir()+"/xtables.lock")
	for _, a := range nfacct {
		addNfacct(b, ns, a)
	}
	netnstest.Run(b, ns, text, "iptables-legacy-restore", "-w", "5")
	// What Real.Save does: the change check's entry read (blobs mapped
	// outside the heap, hashed), then the decode of the same blobs.
	decode := func() *Ruleset {
		var dec *decoded
		err := nfnetlink.InNetNS(netnsPath(ns), func() error {
			var err error
			_, dec, err = legacyFingerprint(IPv4, true, func(fingerprint) bool { return true })
			return err
		})
		if err != nil || dec == nil || dec.err != nil {
			b.Fatal(err, dec)
		}
		return dec.rules
	}
	var infos []LegacyTableInfo
	var blobs [][]byte
	if err := nfnetlink.InNetNS(netnsPath(ns), func() error {
		var err error
		infos, blobs, err = readLegacyTables()
		return err
	}); err != nil {
		b.Fatal(err)
	}
	// The decode alone, of blobs already read.
	decodeOnly := func() *Ruleset {
		rs, err := DecodeLegacy(infos, blobs)
		if err != nil {
			b.Fatal(err)
		}
		return rs
	}
	save := func() *Ruleset { return saveNS(b, ns) }
	if d := diffTokens(save(), decode()); len(d) > 0 {
		b.Fatalf("decode differs from the save:\n%s", strings.Join(d, "\n"))
	}
	for _, m := range []struct {
		name string
		read func() *Ruleset
	}{{"decode", decode}, {"decode-only", decodeOnly}, {"save", save}} {
		b.Run(m.name, func(b *testing.B) {
			var rules int
			b.ReportAllocs()
			cpu0 := cpuTimeAll()
			for b.Loop() {
				rules = m.read().RuleCount()
			}
			b.ReportMetric(float64((cpuTimeAll()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			b.ReportMetric(float64(rules), "rules")
		})
	}
}

// cpuTimeAll is the user+system CPU time of this process and its waited-for
// children.
func cpuTimeAll() time.Duration {
	var ru, rc unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil || unix.Getrusage(unix.RUSAGE_CHILDREN, &rc) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano() + rc.Utime.Nano() + rc.Stime.Nano())
}

// BenchmarkDecodeFixture: the captured kube-proxy v1.34.4 rules.
func BenchmarkDecodeFixture(b *testing.B) {
	rs, _ := loadFixture(b)
	benchDecode(b, rs.String(), "ct_state_invalid_dropped_pkts")
}

// BenchmarkDecode85kNat: an 85k-rule kube-proxy-shaped nat table, the size
// kube-proxy writes for ~5,000 Services (docs/SCALE.md).
func BenchmarkDecode85kNat(b *testing.B) { benchDecode(b, natTable(85000)) }
