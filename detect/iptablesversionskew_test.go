package detect

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/procs"
)

// fakeProcRoot builds a proc root whose <pid>/root directories hold the
// given files ("->target" makes a symlink).
func fakeProcRoot(t testing.TB, roots map[int]map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for pid, files := range roots {
		root := filepath.Join(dir, strconv.Itoa(pid), "root")
		if err := os.MkdirAll(root, 0o755); err != nil {
			t.Fatal(err)
		}
		for p, c := range files {
			full := filepath.Join(root, p)
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			var err error
			if strings.HasPrefix(c, "->") {
				err = os.Symlink(c[2:], full)
			} else {
				err = os.WriteFile(full, []byte(c), 0o755)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// writeFiles writes files under dir.
func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// debianRoot is a root filesystem whose iptables is the Debian
// alternatives link to the backend's multi-call binary, with the version
// string embedded as in the real binaries.
func debianRoot(backend, version string) map[string]string {
	tag := map[string]string{"nft": "nf_tables", "legacy": "legacy"}[backend]
	return map[string]string{
		"/usr/sbin/iptables":                      "->/etc/alternatives/iptables",
		"/etc/alternatives/iptables":              "->/usr/sbin/iptables-" + backend,
		"/usr/sbin/iptables-" + backend:           "->xtables-" + backend + "-multi",
		"/usr/sbin/xtables-" + backend + "-multi": "ELF\x00%s v%s\x00" + version + " (" + tag + ")\x00",
	}
}

func TestIPTablesVersionSkew(t *testing.T) {
	wrapper := map[string]string{"/usr/sbin/iptables": "->iptables-wrapper", "/usr/sbin/iptables-wrapper": "#!/bin/sh\n"}
	nftKube := "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-X - [0:0]\n-A KUBE-SERVICES -j KUBE-X\nCOMMIT\n"
	cases := []struct {
		name     string
		roots    map[int]map[string]string
		cni      bool
		legacy   string
		nft      string
		set      func(p *IPTablesVersionSkewParams)
		want     []string
		wantSkip bool
	}{
		{name: "all the same", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("nft", "1.8.9"), 60: debianRoot("nft", "1.8.9")}, cni: true,
			nft: nftKube},
		{name: "kube-proxy legacy on an nft host, its rules in legacy", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("legacy", "1.8.9")},
			legacy: nftKube,
			want:   []string{"iptables/versions/host/kube-proxy/backend"}},
		{name: "CNI agent on another backend than kube-proxy and host", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("nft", "1.8.9"), 60: debianRoot("legacy", "1.8.9")}, cni: true,
			nft:  nftKube,
			want: []string{"iptables/versions/host/cni/calico-node/backend", "iptables/versions/kube-proxy/cni/calico-node/backend"}},
		{name: "minor skew", roots: map[int]map[string]string{1: debianRoot("nft", "1.6.1"), 50: debianRoot("nft", "1.8.9")},
			nft: nftKube, want: []string{"iptables/versions/host/kube-proxy/version"}},
		{name: "patch skew not reported by default", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.4"), 50: debianRoot("nft", "1.8.9")},
			nft: nftKube},
		{name: "patch skew when asked", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.4"), 50: debianRoot("nft", "1.8.9")},
			nft: nftKube, set: func(p *IPTablesVersionSkewParams) { p.VersionSkew = "patch" },
			want: []string{"iptables/versions/host/kube-proxy/version"}},
		{name: "kube-proxy writes nft, KUBE-* rules only in legacy", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("nft", "1.8.9")},
			legacy: nftKube, want: []string{"iptables/versions/kube-proxy/kube-rules/backend"}},
		{name: "kube-proxy's wrapper undecided: no backend claim", roots: map[int]map[string]string{1: debianRoot("legacy", "1.8.9"), 50: wrapper},
			nft: nftKube},
		{name: "no kube-proxy, no CNI agent: nothing to compare", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.9")},
			wantSkip: true},
		{name: "nftables mode skips", roots: map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("legacy", "1.8.9")},
			set: func(p *IPTablesVersionSkewParams) { p.ProxyMode = "nftables" }, wantSkip: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			pf := procs.NewFake(999)
			if _, ok := c.roots[50]; ok {
				pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "/usr/local/bin/kube-proxy", "--config=/c"))
			}
			if c.cni {
				pf.Add(fakeProc(60, 1, "calico-node", procT0.Add(-time.Hour), "S", "calico-node", "-felix"))
			}
			n, _ := newIssue3Node(pf)
			n.ProcRoot = fakeProcRoot(t, c.roots)
			ipt := iptables.NewFake()
			ipt.SetRules(iptables.IPv4, iptables.Legacy, c.legacy)
			ipt.SetRules(iptables.IPv4, iptables.NFT, c.nft)
			n.IPTables = ipt
			d := newIssue3Detector(t, "IPTablesVersionSkew", n, func(p any) {
				pp := p.(*IPTablesVersionSkewParams)
				if c.set != nil {
					c.set(pp)
				}
			})
			got, err := d.Detect(context.Background())
			if _, skip := finding.IsSkip(err); skip != c.wantSkip || (err != nil && !skip) {
				t.Fatalf("err = %v, wantSkip %v", err, c.wantSkip)
			}
			if !reflect.DeepEqual(findingTargets(got), c.want) {
				t.Fatalf("targets = %v, want %v\n%+v", findingTargets(got), c.want, got)
			}
			for _, f := range got {
				t.Log(f.Message)
				if f.Detector != "IPTablesVersionSkew" || f.Evidence == nil {
					t.Errorf("%+v", f)
				}
			}
			if !c.wantSkip && len(got) == 0 {
				j := d.(Judged).Judged()
				if !strings.Contains(j, "host: iptables") {
					t.Errorf("judged = %q", j)
				}
				t.Log(j)
			}
		})
	}
}

func TestIPTablesVersionSkewEvidenceSaysWhichIsWhich(t *testing.T) {
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	n, _ := newIssue3Node(pf)
	n.ProcRoot = fakeProcRoot(t, map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("legacy", "1.8.7")})
	got, err := newIssue3Detector(t, "IPTablesVersionSkew", n, func(p any) { p.(*IPTablesVersionSkewParams).CheckKubeRulesBackend = false }).Detect(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("%v %+v", err, got)
	}
	ev := got[0].Evidence
	host, _ := ev["host"].(map[string]any)
	kp, _ := ev["kube-proxy"].(map[string]any)
	if host["backend"] != "nft" || host["version"] != "1.8.9" || host["root"] != filepath.Join(n.ProcRoot, "1", "root") ||
		kp["backend"] != "legacy" || kp["version"] != "1.8.7" || kp["pid"] != int32(50) || kp["root"] != filepath.Join(n.ProcRoot, "50", "root") {
		t.Fatalf("evidence = %v", ev)
	}
}

func TestIPTablesVersionSkewParamsValidate(t *testing.T) {
	ty, _ := Lookup("IPTablesVersionSkew")
	p := ty.NewParams().(*IPTablesVersionSkewParams)
	if errs := p.Validate(); len(errs) != 0 {
		t.Fatalf("defaults: %v", errs)
	}
	p.ProxyMode, p.VersionSkew, p.CNIAgents, p.Families, p.SaveTimeout.Duration = "x", "major", []string{"a/b"}, []string{"IPv5"}, 0
	var fields []string
	for _, e := range p.Validate() {
		fields = append(fields, e.Field)
	}
	if want := []string{"proxyMode", "versionSkew", "cniAgents[0]", "families[0]", "saveTimeout"}; !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %v, want %v", fields, want)
	}
}

// TestIPTablesVersionSkewRemembersBinaries: an unchanged binary is not
// scanned again at the next cycle; kube-proxy's, replaced by an upgrade
// (a new file renamed over it), is, and the skew it brings is reported.
func TestIPTablesVersionSkewRemembersBinaries(t *testing.T) {
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	pf.Add(fakeProc(60, 1, "calico-node", procT0.Add(-time.Hour), "S", "calico-node"))
	n, _ := newIssue3Node(pf)
	n.Clock = clocktesting.NewFakeClock(time.Now().Add(time.Hour)) // the files are old by it
	n.ProcRoot = fakeProcRoot(t, map[int]map[string]string{1: debianRoot("nft", "1.8.9"), 50: debianRoot("nft", "1.8.9"), 60: debianRoot("nft", "1.8.9")})
	d := newIssue3Detector(t, "IPTablesVersionSkew", n, func(p any) { p.(*IPTablesVersionSkewParams).CheckKubeRulesBackend = false })
	cycle := func(wantReads int, wantTargets []string) {
		t.Helper()
		got, err := d.Detect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if r := d.(*iptablesVersionSkew).installs.Reads(); r != wantReads || !reflect.DeepEqual(findingTargets(got), wantTargets) {
			t.Fatalf("%d files read, findings %v; want %d, %v", r, findingTargets(got), wantReads, wantTargets)
		}
	}
	cycle(3, nil)
	cycle(3, nil)
	bin := filepath.Join(n.ProcRoot, "50", "root", "usr/sbin/xtables-nft-multi")
	if err := os.WriteFile(bin+".new", []byte("ELF\x00%s v%s\x001.6.1 (nf_tables)\x00"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(bin+".new", bin); err != nil {
		t.Fatal(err)
	}
	skew := []string{"iptables/versions/host/kube-proxy/version", "iptables/versions/kube-proxy/cni/calico-node/version"}
	cycle(4, skew)
	cycle(4, skew)
}

// TestIPTablesVersionSkewHostRoot: with --host-root (the host's "/"
// mounted read-only in the pod), the host's iptables is read there, not
// through /proc/1/root, which needs ptrace access to PID 1 (a VM's
// protected init refuses it even to root: "lstat /host/proc/1/root/usr:
// permission denied", and the host party was unknown, so nothing compared).
func TestIPTablesVersionSkewHostRoot(t *testing.T) {
	pf := procs.NewFake(999)
	pf.Add(fakeProc(50, 1, "kube-proxy", procT0.Add(-time.Hour), "S", "kube-proxy"))
	n, _ := newIssue3Node(pf)
	// PID 1's root is absent from the proc root (unreadable), kube-proxy's is there.
	n.ProcRoot = fakeProcRoot(t, map[int]map[string]string{50: debianRoot("legacy", "1.8.7")})
	n.HostRoot = fakeProcRoot(t, map[int]map[string]string{0: debianRoot("nft", "1.8.9")}) + "/0/root"
	got, err := newIssue3Detector(t, "IPTablesVersionSkew", n, func(p any) { p.(*IPTablesVersionSkewParams).CheckKubeRulesBackend = false }).Detect(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("want one finding (host nft 1.8.9 vs kube-proxy legacy 1.8.7), got %v %+v", err, got)
	}
	host, _ := got[0].Evidence["host"].(map[string]any)
	if host["root"] != n.HostRoot || host["backend"] != "nft" || host["version"] != "1.8.9" {
		t.Fatalf("host evidence = %v", host)
	}
}
