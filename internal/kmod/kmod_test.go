package kmod

import (
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func write(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestStateWithModules(t *testing.T) {
	proc, host := t.TempDir(), t.TempDir()
	write(t, proc, map[string]string{
		"modules":               "xt_conntrack 16384 3 - Live 0x0000000000000000\nnf_conntrack 172032 5 xt_conntrack,nf_nat, Live 0x0\nip_tables 32768 0 - Live 0x0\n",
		"net/ip_tables_matches": "conntrack\ncomment\ntcp\nudp\n",
		"net/ip_tables_targets": "MARK\nERROR\n",
		"net/ip_tables_names":   "filter\n",
		"sys/kernel/osrelease":  "6.1.0-18-amd64\n",
	})
	write(t, host, map[string]string{
		"lib/modules/6.1.0-18-amd64/modules.builtin": "kernel/net/netfilter/x_tables.ko\nkernel/net/netfilter/xt_tcpudp.ko\n",
		"lib/modules/6.1.0-18-amd64/modules.dep":     "kernel/net/netfilter/xt_statistic.ko.xz:\nkernel/net/netfilter/xt_MASQUERADE.ko.zst: kernel/net/netfilter/nf_nat.ko.zst\n",
		"sys/module/nf_tables/refcnt":                "0\n",
	})
	s := Read(proc, host)
	for _, c := range []struct {
		mod  string
		prov Provides
		want State
	}{
		{"xt_conntrack", Provides{Family: IPv4, Matches: []string{"conntrack"}}, Loaded},
		{"nf-conntrack", Provides{}, Loaded},
		{"xt_comment", Provides{Family: IPv4, Matches: []string{"comment"}}, Registered},
		{"xt_mark", Provides{Family: IPv4, Matches: []string{"mark"}, Targets: []string{"MARK"}}, Missing},
		{"xt_tcpudp", Provides{Family: IPv4, Matches: []string{"tcp", "udp"}}, Registered},
		{"iptable_filter", Provides{Family: IPv4, Tables: []string{"filter"}}, Registered},
		{"iptable_nat", Provides{Family: IPv4, Tables: []string{"nat"}}, Missing},
		{"x_tables", Provides{}, Builtin},
		{"nf_tables", Provides{}, Builtin},
		{"xt_statistic", Provides{Family: IPv4, Matches: []string{"statistic"}}, Loadable},
		{"xt_MASQUERADE", Provides{Family: IPv4, Targets: []string{"MASQUERADE"}}, Loadable},
		{"ip6t_REJECT", Provides{Family: IPv6, Targets: []string{"REJECT"}}, Missing},
	} {
		if got := s.State(c.mod, c.prov); got != c.want {
			t.Errorf("%s: %s, want %s", c.mod, got, c.want)
		}
	}
	if !s.HasModules || s.Release != "6.1.0-18-amd64" || len(s.Errors) != 0 {
		t.Errorf("snapshot %+v", s)
	}
}

// Without modules.builtin/modules.dep (host root unreadable), a module not
// loaded is unknown, not missing.
func TestStateUnknownWithoutModuleLists(t *testing.T) {
	proc := t.TempDir()
	write(t, proc, map[string]string{"modules": "ip_tables 1 0 - Live 0x0\n", "sys/kernel/osrelease": "6.1.0\n"})
	s := Read(proc, filepath.Join(t.TempDir(), "no-such-root"))
	if got := s.State("xt_mark", Provides{Family: IPv4, Matches: []string{"mark"}}); got != Unknown {
		t.Fatalf("xt_mark = %s", got)
	}
	if len(s.Errors) == 0 {
		t.Error("no error recorded for the unreadable module lists")
	}
}

// A kernel without module support (no /proc/modules): the registries are
// authoritative for extensions; modules without one are unknown.
func TestStateNoModuleSupport(t *testing.T) {
	proc := t.TempDir()
	write(t, proc, map[string]string{"net/ip_tables_matches": "mark\nconntrack\n", "net/ip_tables_targets": "MARK\nDNAT\n"})
	s := Read(proc, "")
	for mod, c := range map[string]struct {
		prov Provides
		want State
	}{
		"xt_mark":      {Provides{Family: IPv4, Matches: []string{"mark"}, Targets: []string{"MARK"}}, Registered},
		"xt_statistic": {Provides{Family: IPv4, Matches: []string{"statistic"}}, Missing},
		"ip6t_REJECT":  {Provides{Family: IPv6, Targets: []string{"REJECT"}}, Unknown}, // no IPv6 registry read
		"nf_tables":    {Provides{}, Unknown},
		"iptable_nat":  {Provides{Family: IPv4, Tables: []string{"nat"}}, Unknown},
	} {
		if got := s.State(mod, c.prov); got != c.want {
			t.Errorf("%s: %s, want %s", mod, got, c.want)
		}
	}
}

// This machine: read the real /proc (its kernel has no module support;
// the conntrack match is built in).
func TestReadThisMachine(t *testing.T) {
	s := Read("/proc", "")
	if _, err := os.Stat("/proc/net/ip_tables_matches"); err != nil {
		t.Skip("no /proc/net/ip_tables_matches here")
	}
	if got := s.State("xt_conntrack", Provides{Family: IPv4, Matches: []string{"conntrack"}}); !got.Present() {
		t.Errorf("xt_conntrack = %s (%+v)", got, s)
	}
	t.Logf("sources %v, errors %v, has modules %v", s.Sources, s.Errors, s.HasModules)
}

func TestParsers(t *testing.T) {
	m := ParseModuleList(strings.NewReader("kernel/net/ipv4/netfilter/iptable_nat.ko\nkernel/net/netfilter/nft-compat.ko.xz: a.ko\n\nweird\n.ko\n"))
	if !m["iptable_nat"] || !m["nft_compat"] || len(m) != 2 {
		t.Errorf("module list = %v", m)
	}
	p := ParseProcModules(strings.NewReader("a 1 0 - Live 0x0\n\n  \nb-c 2 1 a, Live 0x0\n" + strings.Repeat("x", 100<<10) + "\nlate 1 0 - Live 0x0\n"))
	if !p["a"] || !p["b_c"] {
		t.Errorf("proc modules = %v", p)
	}
}

func FuzzParsers(f *testing.F) {
	f.Add("nf_nat 1 2 - Live 0x0\nkernel/x/xt_mark.ko.zst: y\nmark\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, m := range []map[string]bool{ParseProcModules(strings.NewReader(s)), ParseNames(strings.NewReader(s)), ParseModuleList(strings.NewReader(s))} {
			for k := range m {
				if k == "" || len(k) >= 64 {
					t.Fatalf("name %q", k)
				}
			}
		}
	})
}

// TestLinesLongerThanTheFirstBuffer: a line longer than the scanner's
// first buffer (4 KiB) but under maxLine is still read whole, and the
// lines after it too; a line over maxLine ends the scan.
func TestLinesLongerThanTheFirstBuffer(t *testing.T) {
	long := strings.Repeat("x", 10<<10)
	var got []int
	lines(strings.NewReader("a\n"+long+"\nb\n"+strings.Repeat("y", maxLine+1)+"\nc\n"), func(l string) { got = append(got, len(l)) })
	if want := []int{1, len(long), 1}; !slices.Equal(got, want) {
		t.Fatalf("line lengths %v, want %v", got, want)
	}
}

// TestConfigGz: /proc/config.gz decides what the module lists cannot
// (no host root: the chart's default pod): "is not set" is missing, =y
// built in, =m or a symbol it does not name stays unknown; what is loaded
// or registered wins over the configuration.
func TestConfigGz(t *testing.T) {
	dir := t.TempDir()
	cfg := "# comment\nCONFIG_NETFILTER_XT_MATCH_STATISTIC=y\n# CONFIG_NETFILTER_XT_MATCH_NFACCT is not set\nCONFIG_NETFILTER_XT_MARK=m\n# CONFIG_NETFILTER_XT_MATCH_COMMENT is not set\nCONFIG_LOCALVERSION=\"-x\"\n"
	var buf bytes.Buffer
	z := gzip.NewWriter(&buf)
	_, _ = z.Write([]byte(cfg))
	_ = z.Close()
	write(t, dir, map[string]string{
		"modules":               "nf_conntrack 172032 5 - Live 0x0\n",
		"net/ip_tables_matches": "comment\n",
	})
	if err := os.WriteFile(filepath.Join(dir, "config.gz"), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	s := Read(dir, "")
	for _, c := range []struct {
		mod  string
		prov Provides
		want State
	}{
		{"xt_nfacct", Provides{Family: IPv4, Matches: []string{"nfacct"}}, Missing},
		{"xt_statistic", Provides{Family: IPv4, Matches: []string{"statistic"}}, Builtin},
		{"xt_mark", Provides{Family: IPv4, Matches: []string{"mark"}}, Unknown},
		{"xt_addrtype", Provides{Family: IPv4, Matches: []string{"addrtype"}}, Unknown},
		{"xt_comment", Provides{Family: IPv4, Matches: []string{"comment"}}, Registered},
		{"nf_conntrack", Provides{}, Loaded},
	} {
		if got := s.State(c.mod, c.prov); got != c.want {
			t.Errorf("%s = %s, want %s (config %v)", c.mod, got, c.want, s.Config)
		}
	}
	if s.Config["CONFIG_LOCALVERSION"] != `"-x"` {
		t.Errorf("config = %v", s.Config)
	}
	// A corrupt config.gz is an unreadable source, not a crash.
	if err := os.WriteFile(filepath.Join(dir, "config.gz"), []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	if s := Read(dir, ""); s.Config != nil || s.State("xt_nfacct", Provides{Family: IPv4, Matches: []string{"nfacct"}}) != Unknown {
		t.Errorf("corrupt config.gz: config %v", s.Config)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add("CONFIG_A=y\n# CONFIG_B is not set\n")
	f.Add("CONFIG_=y\n#  CONFIG_X is not set\nCONFIG_a=m\n")
	f.Fuzz(func(t *testing.T, s string) {
		for k, v := range ParseConfig(strings.NewReader(s)) {
			if !validSymbol(k) || len(v) >= 256 {
				t.Fatalf("%q=%q", k, v)
			}
		}
	})
}
