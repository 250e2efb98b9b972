package detect

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/procs"
)

func TestKubeProxyKernelModules(t *testing.T) {
	const rel = "6.1.0-18-amd64"
	allMatches := "conntrack\ncomment\nmark\nstatistic\naddrtype\ntcp\nudp\n"
	allTargets := "MARK\nDNAT\nSNAT\nMASQUERADE\nREJECT\n"
	procFiles := func(modules, matches, targets string) map[string]string {
		m := map[string]string{"/sys/kernel/osrelease": rel + "\n", "/net/ip_tables_matches": matches, "/net/ip_tables_targets": targets,
			"/sys/net/netfilter/nf_conntrack_max": "262144\n"}
		if modules != "-" {
			m["/modules"] = modules
		}
		return m
	}
	lists := map[string]string{
		"/lib/modules/" + rel + "/modules.builtin": "kernel/net/netfilter/x_tables.ko\n",
		"/lib/modules/" + rel + "/modules.dep":     "kernel/net/netfilter/nf_tables.ko: \nkernel/net/netfilter/nft_compat.ko:\nkernel/net/netfilter/nft_chain_nat.ko:\nkernel/net/ipv4/netfilter/iptable_nat.ko:\nkernel/net/ipv4/netfilter/iptable_filter.ko:\nkernel/net/ipv4/netfilter/ip_tables.ko:\nkernel/net/netfilter/nf_nat.ko:\n",
	}
	merge := func(ms ...map[string]string) map[string]string {
		out := map[string]string{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	cases := []struct {
		name    string
		proc    map[string]string
		host    map[string]string
		kp      map[string]string
		mode    string
		want    []string
		missing string
		skip    bool
		// attention: read again at the next cycle.
		attention bool
	}{
		{name: "everything registered (nft kube-proxy)", proc: procFiles("nf_tables 1 0 - Live 0x0\n", allMatches, allTargets),
			host: merge(lists, debianRoot("nft", "1.8.9")), kp: debianRoot("nft", "1.8.9")},
		{name: "statistic and MASQUERADE missing", proc: procFiles("nf_tables 1 0 - Live 0x0\n", strings.Replace(allMatches, "statistic\n", "", 1), strings.Replace(allTargets, "MASQUERADE\n", "", 1)),
			host: merge(lists, debianRoot("nft", "1.8.9")), kp: debianRoot("nft", "1.8.9"),
			want: []string{"iptables/IPv4/kernel-modules"}, missing: "xt_statistic", attention: true},
		{name: "not loaded but on disk: loadable, no finding", proc: procFiles("x 1 0 - Live 0x0\n", allMatches, allTargets),
			host: merge(lists, debianRoot("legacy", "1.8.9")), kp: debianRoot("legacy", "1.8.9")},
		{name: "module lists unreadable: unknown, no finding", proc: procFiles("x 1 0 - Live 0x0\n", strings.Replace(allMatches, "statistic\n", "", 1), allTargets),
			host: debianRoot("nft", "1.8.9"), kp: debianRoot("nft", "1.8.9"), attention: true},
		{name: "no module support: the registry decides", proc: procFiles("-", strings.Replace(allMatches, "addrtype\n", "", 1), allTargets),
			host: debianRoot("nft", "1.8.9"), kp: debianRoot("nft", "1.8.9"),
			want: []string{"iptables/IPv4/kernel-modules"}, missing: "xt_addrtype", attention: true},
		{name: "nftables mode skips", proc: procFiles("-", "", ""), host: debianRoot("nft", "1.8.9"), mode: "nftables", skip: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pf := procs.NewFake(999)
			roots := map[int]map[string]string{1: c.host}
			if c.kp != nil {
				pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
				roots[50] = c.kp
			}
			n, _ := newIssue3Node(pf)
			n.ProcRoot = fakeProcRoot(t, roots)
			writeFiles(t, n.ProcRoot, c.proc)
			d := newIssue3Detector(t, "KubeProxyKernelModules", n, func(p any) {
				if c.mode != "" {
					p.(*KubeProxyKernelModulesParams).ProxyMode = c.mode
				}
			})
			got, err := d.Detect(context.Background())
			if _, skip := finding.IsSkip(err); skip != c.skip || (err != nil && !skip) {
				t.Fatalf("err = %v", err)
			}
			if !reflect.DeepEqual(findingTargets(got), c.want) {
				t.Fatalf("targets = %v, want %v\n%+v", findingTargets(got), c.want, got)
			}
			if len(got) > 0 {
				t.Log(got[0].Message)
				if !strings.Contains(got[0].Message, c.missing) || got[0].Evidence["backend"] != "nft" {
					t.Errorf("finding = %+v", got[0])
				}
			} else if !c.skip {
				t.Log(d.(Judged).Judged())
			}
			if !c.skip && d.(*kubeProxyKernelModules).last.attention != c.attention {
				t.Errorf("attention = %v, want %v", !c.attention, c.attention)
			}
		})
	}
}

// TestRealKubeProxyKernelModulesThisKernel runs the check on this machine's
// real /proc. Its kernel has no module support (no /proc/modules): every
// feature is built in, the xtables registries list what exists, and the
// nft modules (no registry entry) come out built in from /proc/config.gz
// (unknown without it), never missing.
func TestRealKubeProxyKernelModulesThisKernel(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_tables_matches"); err != nil {
		t.Skip("no /proc/net/ip_tables_matches on this kernel")
	}
	n, clk := newIssue3Node(nil)
	n.ProcRoot = "/proc"
	_, err := os.Stat("/proc/modules")
	noModules := os.IsNotExist(err)
	for _, be := range []string{"legacy", "nft"} {
		d := newIssue3Detector(t, "KubeProxyKernelModules", n, func(p any) {
			pp := p.(*KubeProxyKernelModulesParams)
			pp.Backend, pp.Families = be, []string{"IPv4", "IPv6"}
		})
		got, err := d.Detect(context.Background())
		if err != nil || len(got) != 0 {
			t.Fatalf("%s: %v %+v", be, err, got)
		}
		j := d.(Judged).Judged()
		t.Logf("%s: %s", be, j)
		// /proc/config.gz (this kernel has it) says the nft modules are
		// built in (=y); without it they could only be unknown.
		switch _, err := os.Stat("/proc/config.gz"); {
		case noModules && be == "nft" && err == nil && (strings.Contains(j, "unknown") || !strings.Contains(j, "builtin")):
			t.Errorf("nft modules on a kernel without module support whose /proc/config.gz sets them should be builtin: %s", j)
		case noModules && be == "nft" && err != nil && !strings.Contains(j, "unknown"):
			t.Errorf("nft modules on a kernel without module support should be unknown: %s", j)
		}
		// Unknown without module support stays so until a reboot: the
		// reading is reused; with module support it is read again.
		clk.Step(30 * time.Second)
		if _, err := d.Detect(context.Background()); err != nil {
			t.Fatal(err)
		}
		attention := d.(*kubeProxyKernelModules).last.attention
		if reads := d.(*kubeProxyKernelModules).reads; reads != map[bool]int{true: 2, false: 1}[attention] || (noModules && attention) {
			t.Errorf("%s: %d readings after two cycles 30 s apart (attention %v, no module support %v): %s", be, reads, attention, noModules, d.(Judged).Judged())
		}
	}
}

func TestRereadModules(t *testing.T) {
	t0 := procT0
	ok := &kmodReading{at: t0}
	attention := &kmodReading{at: t0, attention: true}
	for _, c := range []struct {
		name     string
		prev     *kmodReading
		now      time.Time
		reuseFor time.Duration
		read     bool
		why      string
	}{
		{"first cycle (and --once)", nil, t0, 5 * time.Minute, true, "first reading"},
		{"all present, 30 s later", ok, t0.Add(30 * time.Second), 5 * time.Minute, false, ""},
		{"all present, just under reuseFor", ok, t0.Add(5*time.Minute - time.Nanosecond), 5 * time.Minute, false, ""},
		{"all present, reuseFor later", ok, t0.Add(5 * time.Minute), 5 * time.Minute, true, "5m0s old"},
		{"a missing or unknown module: next cycle", attention, t0.Add(time.Second), 5 * time.Minute, true, "missing or unknown"},
		{"clock went back", ok, t0.Add(-time.Second), 5 * time.Minute, true, "clock went back"},
		{"reuseFor 0: every cycle", ok, t0, 0, true, "every cycle"},
	} {
		read, why := rereadModules(c.prev, c.now, c.reuseFor)
		if read != c.read || !strings.Contains(why, c.why) {
			t.Errorf("%s: read %v (%q), want %v (%q)", c.name, read, why, c.read, c.why)
		}
	}
}

// TestKubeProxyKernelModulesReusesReading runs cycles over a fake proc
// root with a fake clock: a reading with every module present is reused
// until reuseFor, a missing module is read again every cycle until fixed.
func TestKubeProxyKernelModulesReusesReading(t *testing.T) {
	const rel = "6.1.0-18-amd64"
	matches := "conntrack\ncomment\nmark\nstatistic\naddrtype\ntcp\nudp\n"
	proc := map[string]string{
		"/sys/kernel/osrelease": rel + "\n", "/net/ip_tables_matches": matches,
		"/net/ip_tables_targets": "MARK\nDNAT\nSNAT\nMASQUERADE\nREJECT\n", "/net/ip_tables_names": "nat\nfilter\n",
		"/sys/net/netfilter/nf_conntrack_max": "262144\n",
		"/modules":                            "nf_tables 1 0 - Live 0x0\nnft_compat 1 0 - Live 0x0\nnft_chain_nat 1 0 - Live 0x0\nnf_nat 1 0 - Live 0x0\n",
	}
	host := debianRoot("nft", "1.8.9")
	host["/lib/modules/"+rel+"/modules.builtin"] = "kernel/net/netfilter/x_tables.ko\n"
	host["/lib/modules/"+rel+"/modules.dep"] = "kernel/net/netfilter/nf_nat.ko:\n"
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	n, clk := newIssue3Node(pf)
	n.ProcRoot = fakeProcRoot(t, map[int]map[string]string{1: host, 50: debianRoot("nft", "1.8.9")})
	writeFiles(t, n.ProcRoot, proc)
	newDetector := func() *kubeProxyKernelModules {
		return newIssue3Detector(t, "KubeProxyKernelModules", n, nil).(*kubeProxyKernelModules)
	}
	d := newDetector()
	cycle := func(step time.Duration, wantReads int, wantFindings int, wantJudged string) []finding.Finding {
		t.Helper()
		clk.Step(step)
		got, err := d.Detect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		j := d.Judged()
		if d.reads != wantReads || len(got) != wantFindings || !strings.Contains(j, wantJudged) {
			t.Fatalf("at +%s: %d readings, %d findings, judged %q; want %d, %d, %q",
				clk.Now().Sub(procT0), d.reads, len(got), j, wantReads, wantFindings, wantJudged)
		}
		return got
	}
	cycle(0, 1, 0, "modules read at 2026-11-21T12:00:00Z (first reading)")
	cycle(30*time.Second, 1, 0, "modules read at 2026-11-21T12:00:00Z, reused until 2026-11-21T12:05:00Z")

	// xt_statistic unloaded: not seen while the reading is reused (at
	// most reuseFor), then reported and read again every cycle.
	writeFiles(t, n.ProcRoot, map[string]string{"/net/ip_tables_matches": strings.Replace(matches, "statistic\n", "", 1)})
	cycle(4*time.Minute, 1, 0, "reused until 2026-11-21T12:05:00Z")
	got := cycle(30*time.Second, 2, 1, "modules read at 2026-11-21T12:05:00Z (the last reading is 5m0s old")
	if got[0].Evidence["readAt"] != "2026-11-21T12:05:00Z" || !strings.Contains(got[0].Message, "xt_statistic") {
		t.Fatalf("finding = %+v", got[0])
	}
	cycle(30*time.Second, 3, 1, "(the last reading had a missing or unknown module)")

	// Fixed (modprobe): seen at the next cycle, then reused again.
	writeFiles(t, n.ProcRoot, map[string]string{"/net/ip_tables_matches": matches})
	cycle(30*time.Second, 4, 0, "modules read at 2026-11-21T12:06:00Z (the last reading had a missing or unknown module)")
	cycle(30*time.Second, 4, 0, "reused until 2026-11-21T12:11:00Z")

	// A new detector (a new process: --once, or a policy reload) reads
	// at once.
	d = newDetector()
	cycle(0, 1, 0, "(first reading)")
}

// TestKubeProxyKernelModulesWithoutHostRoot: the chart's default pod (no
// CAP_SYS_PTRACE, so neither the host's nor kube-proxy's root) still runs
// the check from /proc alone (on main it skipped): /proc/config.gz saying
// "# CONFIG_NETFILTER_XT_MATCH_NFACCT is not set" on a kernel whose
// nfnetlink_acct is loaded (kube-proxy then writes -m nfacct) is a
// critical finding naming xt_nfacct (kubernetes/kubernetes#142068), and
// the backend is unknown (said) rather than guessed.
func TestKubeProxyKernelModulesWithoutHostRoot(t *testing.T) {
	cfg := func(nfacct string) []byte {
		var buf bytes.Buffer
		z := gzip.NewWriter(&buf)
		_, _ = z.Write([]byte("CONFIG_NETFILTER_XT_MATCH_STATISTIC=y\n" + nfacct + "\n"))
		_ = z.Close()
		return buf.Bytes()
	}
	for _, c := range []struct {
		name, modules, nfacct string
		want                  []string
	}{
		{"nfnetlink_acct loaded, xt_nfacct not built", "nfnetlink_acct 16384 0 - Live 0x0\n", "# CONFIG_NETFILTER_XT_MATCH_NFACCT is not set", []string{"iptables/IPv4/kernel-modules"}},
		{"nfnetlink_acct loaded, xt_nfacct built in", "nfnetlink_acct 16384 0 - Live 0x0\n", "CONFIG_NETFILTER_XT_MATCH_NFACCT=y", nil},
		{"no nfnetlink_acct: kube-proxy writes no nfacct rule", "x 1 0 - Live 0x0\n", "# CONFIG_NETFILTER_XT_MATCH_NFACCT is not set", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, _ := newIssue3Node(procs.NewFake(999))
			n.Unavailable = map[string]string{node.SubsystemHostRoot: "needs CAP_SYS_PTRACE to read the host's files"}
			n.ProcRoot = fakeProcRoot(t, nil)
			writeFiles(t, n.ProcRoot, map[string]string{"/modules": c.modules,
				"/net/ip_tables_matches": "conntrack\ncomment\nmark\nstatistic\naddrtype\ntcp\nudp\n", "/net/ip_tables_targets": "MARK\nDNAT\nSNAT\nMASQUERADE\nREJECT\n",
				"/sys/net/netfilter/nf_conntrack_max": "262144\n"})
			if err := os.WriteFile(filepath.Join(n.ProcRoot, "config.gz"), cfg(c.nfacct), 0o644); err != nil {
				t.Fatal(err)
			}
			d := newIssue3Detector(t, "KubeProxyKernelModules", n, nil)
			got, err := d.Detect(context.Background())
			if err != nil {
				t.Fatalf("err = %v (the check must run without the host's root)", err)
			}
			if !reflect.DeepEqual(findingTargets(got), c.want) {
				t.Fatalf("targets = %v, want %v\n%+v", findingTargets(got), c.want, got)
			}
			j := d.(Judged).Judged()
			if !strings.Contains(j, "backend unknown (needs CAP_SYS_PTRACE") {
				t.Errorf("judged %q: the unknown backend and why are not said", j)
			}
			if len(got) > 0 && (!strings.Contains(got[0].Message, "xt_nfacct") || got[0].Severity != finding.Critical) {
				t.Errorf("finding %s: %s", got[0].Severity, got[0].Message)
			}
		})
	}
}
