package detect

import (
	"context"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

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
	}{
		{name: "everything registered (nft kube-proxy)", proc: procFiles("nf_tables 1 0 - Live 0x0\n", allMatches, allTargets),
			host: merge(lists, debianRoot("nft", "1.8.9")), kp: debianRoot("nft", "1.8.9")},
		{name: "statistic and MASQUERADE missing", proc: procFiles("nf_tables 1 0 - Live 0x0\n", strings.Replace(allMatches, "statistic\n", "", 1), strings.Replace(allTargets, "MASQUERADE\n", "", 1)),
			host: merge(lists, debianRoot("nft", "1.8.9")), kp: debianRoot("nft", "1.8.9"),
			want: []string{"iptables/IPv4/kernel-modules"}, missing: "xt_statistic"},
		{name: "not loaded but on disk: loadable, no finding", proc: procFiles("x 1 0 - Live 0x0\n", allMatches, allTargets),
			host: merge(lists, debianRoot("legacy", "1.8.9")), kp: debianRoot("legacy", "1.8.9")},
		{name: "module lists unreadable: unknown, no finding", proc: procFiles("x 1 0 - Live 0x0\n", strings.Replace(allMatches, "statistic\n", "", 1), allTargets),
			host: debianRoot("nft", "1.8.9"), kp: debianRoot("nft", "1.8.9")},
		{name: "no module support: the registry decides", proc: procFiles("-", strings.Replace(allMatches, "addrtype\n", "", 1), allTargets),
			host: debianRoot("nft", "1.8.9"), kp: debianRoot("nft", "1.8.9"),
			want: []string{"iptables/IPv4/kernel-modules"}, missing: "xt_addrtype"},
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
			if _, skip := IsSkip(err); skip != c.skip || (err != nil && !skip) {
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
		})
	}
}

// TestRealKubeProxyKernelModulesThisKernel runs the check on this machine's
// real /proc. Its kernel has no module support (no /proc/modules): every
// feature is built in, the xtables registries list what exists, and the
// nft modules (no registry entry) must come out unknown, not missing.
func TestRealKubeProxyKernelModulesThisKernel(t *testing.T) {
	if _, err := os.Stat("/proc/net/ip_tables_matches"); err != nil {
		t.Skip("no /proc/net/ip_tables_matches on this kernel")
	}
	n, _ := newIssue3Node(nil)
	n.ProcRoot = "/proc"
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
		if _, err := os.Stat("/proc/modules"); os.IsNotExist(err) && be == "nft" && !strings.Contains(j, "unknown") {
			t.Errorf("nft modules on a kernel without module support should be unknown: %s", j)
		}
	}
}
