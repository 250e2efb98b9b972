package detect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// benchVersionSkewNode is a node with a host, a kube-proxy and a CNI agent,
// each with its own iptables.
func benchVersionSkewNode(b *testing.B) Detector {
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	pf.Add(fakeProc(60, 1, "calico-node", procT0.Add(-time.Hour), "S", "calico-node"))
	n, _ := newIssue3Node(pf)
	n.ProcRoot = fakeProcRoot(b, map[int]map[string]string{
		1: benchRoot("nft", "1.8.9"), 50: benchRoot("nft", "1.8.9"), 60: benchRoot("nft", "1.8.7"),
	})
	return newIssue3Detector(b, "IPTablesVersionSkew", n, func(p any) {
		p.(*IPTablesVersionSkewParams).CheckKubeRulesBackend = false
	})
}

// BenchmarkIPTablesVersionSkewCycle is one cycle of IPTablesVersionSkew
// on an unchanged node (three roots, three ~230 KB binaries).
func BenchmarkIPTablesVersionSkewCycle(b *testing.B) {
	d := benchVersionSkewNode(b)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := d.Detect(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKubeProxyKernelModulesCycle is one cycle of
// KubeProxyKernelModules on this machine's real /proc registries
// (/proc/net/ip*_tables_*, IPv4 and IPv6), the clock moving on by the
// default 30 s interval each cycle: the legacy backend from the policy,
// and auto (kube-proxy's iptables read from a fake root).
func BenchmarkKubeProxyKernelModulesCycle(b *testing.B) {
	if _, err := os.Stat("/proc/net/ip_tables_matches"); err != nil {
		b.Skip("no /proc/net/ip_tables_matches on this kernel")
	}
	for _, be := range []string{"legacy", "auto"} {
		b.Run(be, func(b *testing.B) {
			pf := procs.NewFake(999)
			pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
			n, clk := newIssue3Node(pf)
			n.ProcRoot = "/proc"
			if be == "auto" {
				// The host's and kube-proxy's iptables from fake roots,
				// the registries from the real /proc.
				n.ProcRoot = fakeProcRoot(b, map[int]map[string]string{1: benchRoot("nft", "1.8.9"), 50: benchRoot("nft", "1.8.9")})
				for _, p := range []string{"net", "modules", "sys"} {
					if err := os.Symlink(filepath.Join("/proc", p), filepath.Join(n.ProcRoot, p)); err != nil {
						b.Fatal(err)
					}
				}
			}
			d := newIssue3Detector(b, "KubeProxyKernelModules", n, func(p any) {
				pp := p.(*KubeProxyKernelModulesParams)
				pp.Backend, pp.Families = be, []string{"IPv4", "IPv6"}
			})
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := d.Detect(context.Background()); err != nil {
					b.Fatal(err)
				}
				clk.Step(30 * time.Second)
			}
		})
	}
}
