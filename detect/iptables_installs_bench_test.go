package detect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/procs"
)

// benchRoot is debianRoot with a multi-call binary the size of Debian's
// xtables-nft-multi (~230 KB), its version string near the end, so that
// scanning it costs what scanning the real one does.
func benchRoot(backend, version string) map[string]string {
	r := debianRoot(backend, version)
	bin := "/usr/sbin/xtables-" + backend + "-multi"
	r[bin] = strings.Repeat("\x7fELF padding ", 230_000/13) + r[bin]
	return r
}

// benchClock is a clock an hour ahead of the real one: the files a
// benchmark writes are older than iptables.RacyWindow by it, as a node's
// binaries are.
func benchClock() *clocktesting.FakeClock {
	return clocktesting.NewFakeClock(time.Now().Add(time.Hour))
}

// BenchmarkIPTablesVersionSkewCycle is one cycle of IPTablesVersionSkew
// on an unchanged node: a host, a kube-proxy and a CNI agent, each with
// its own ~230 KB iptables binary.
func BenchmarkIPTablesVersionSkewCycle(b *testing.B) {
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	pf.Add(fakeProc(60, 1, "calico-node", procT0.Add(-time.Hour), "S", "calico-node"))
	n, _ := newIssue3Node(pf)
	n.Clock = benchClock()
	n.ProcRoot = fakeProcRoot(b, map[int]map[string]string{
		1: benchRoot("nft", "1.8.9"), 50: benchRoot("nft", "1.8.9"), 60: benchRoot("nft", "1.8.7"),
	})
	d := newIssue3Detector(b, "IPTablesVersionSkew", n, func(p any) {
		p.(*IPTablesVersionSkewParams).CheckKubeRulesBackend = false
	})
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := d.Detect(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(d.(*iptablesVersionSkew).installs.Reads())/float64(b.N), "files-read/op")
}

// BenchmarkKubeProxyKernelModulesCycle is one cycle of
// KubeProxyKernelModules, the clock moving on by the default 30 s
// interval each cycle:
//   - legacy: the backend from the policy, this machine's real /proc;
//   - auto: kube-proxy's and the host's iptables read from fake roots, the
//     registries from the real /proc (on a kernel without module support,
//     as this workplace's, the nft modules are unknown: read every cycle);
//   - all-present: a fake proc root where every module is loaded or
//     registered (a healthy node), read every cycle (reuseFor 0, as before
//     the reading was reused) and with the default reuseFor.
func BenchmarkKubeProxyKernelModulesCycle(b *testing.B) {
	if _, err := os.Stat("/proc/net/ip_tables_matches"); err != nil {
		b.Skip("no /proc/net/ip_tables_matches on this kernel")
	}
	allPresent := map[string]string{
		"/sys/kernel/osrelease": "6.1.0-18-amd64\n", "/net/ip_tables_matches": "conntrack\ncomment\nmark\nstatistic\naddrtype\ntcp\nudp\n",
		"/net/ip_tables_targets": "MARK\nDNAT\nSNAT\nMASQUERADE\nREJECT\n", "/net/ip_tables_names": "nat\nfilter\n",
		"/sys/net/netfilter/nf_conntrack_max": "262144\n",
		"/modules":                            "nf_tables 1 0 - Live 0x0\nnft_compat 1 0 - Live 0x0\nnft_chain_nat 1 0 - Live 0x0\nnf_nat 1 0 - Live 0x0\n",
	}
	for _, c := range []struct {
		name      string
		backend   string
		proc      string // "real", "registries" (real /proc/net, fake roots), "fake"
		everyTime bool
	}{
		{"legacy", "legacy", "real", false},
		{"auto", "auto", "registries", false},
		{"all-present/every-cycle", "auto", "fake", true},
		{"all-present/reused", "auto", "fake", false},
	} {
		b.Run(c.name, func(b *testing.B) {
			pf := procs.NewFake(999)
			pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
			n, _ := newIssue3Node(pf)
			clk := benchClock()
			n.Clock = clk
			n.ProcRoot = "/proc"
			if c.proc != "real" {
				n.ProcRoot = fakeProcRoot(b, map[int]map[string]string{1: benchRoot("nft", "1.8.9"), 50: benchRoot("nft", "1.8.9")})
			}
			switch c.proc {
			case "registries":
				for _, p := range []string{"net", "modules", "sys"} {
					if err := os.Symlink(filepath.Join("/proc", p), filepath.Join(n.ProcRoot, p)); err != nil {
						b.Fatal(err)
					}
				}
			case "fake":
				writeFiles(b, n.ProcRoot, allPresent)
			}
			d := newIssue3Detector(b, "KubeProxyKernelModules", n, func(p any) {
				pp := p.(*KubeProxyKernelModulesParams)
				pp.Backend, pp.Families = c.backend, []string{"IPv4", "IPv6"}
				if c.proc == "fake" {
					pp.Families = []string{"IPv4"}
				}
				if c.everyTime {
					pp.ReuseFor.Duration = 0
				}
			})
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := d.Detect(context.Background()); err != nil {
					b.Fatal(err)
				}
				clk.Step(30 * time.Second)
			}
			b.ReportMetric(float64(d.(*kubeProxyKernelModules).reads)/float64(b.N), "readings/op")
		})
	}
}
