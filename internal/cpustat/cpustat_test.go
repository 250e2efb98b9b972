package cpustat

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseCPUStat(t *testing.T) {
	v2 := "usage_usec 2000000\nuser_usec 1500000\nsystem_usec 500000\nnr_periods 100\nnr_throttled 40\nthrottled_usec 3500000\nnr_bursts 0\nburst_usec 0\n"
	c, err := ParseCPUStat(2, strings.NewReader(v2))
	if err != nil {
		t.Fatal(err)
	}
	want := CgroupCPU{Version: 2, Periods: 100, Throttled: 40, ThrottledTime: 3500 * time.Millisecond, Usage: 2 * time.Second, Quota: true}
	if c != want {
		t.Errorf("v2: %+v, want %+v", c, want)
	}
	v1 := "nr_periods 10\nnr_throttled 3\nthrottled_time 250000000\nnr_bursts 0\nburst_time 0\n"
	c, err = ParseCPUStat(1, strings.NewReader(v1))
	if err != nil {
		t.Fatal(err)
	}
	want = CgroupCPU{Version: 1, Periods: 10, Throttled: 3, ThrottledTime: 250 * time.Millisecond, Quota: true}
	if c != want {
		t.Errorf("v1: %+v, want %+v", c, want)
	}
	// v2 without the cpu controller: usage only.
	c, err = ParseCPUStat(2, strings.NewReader("usage_usec 10\nuser_usec 5\nsystem_usec 5\n"))
	if err != nil || c.Quota || c.Usage != 10*time.Microsecond {
		t.Errorf("usage only: %+v %v", c, err)
	}
	for _, bad := range []string{"", "nr_periods x\n", "hello world\n", "nr_throttled -1\n"} {
		if _, err := ParseCPUStat(2, strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	// Saturation, not overflow.
	c, err = ParseCPUStat(2, strings.NewReader("throttled_usec 18446744073709551615\n"))
	if err != nil || c.ThrottledTime <= 0 {
		t.Errorf("huge: %+v %v", c, err)
	}
}

func TestCgroupCPUSub(t *testing.T) {
	a := CgroupCPU{Version: 2, Path: "/kp", Periods: 10, Throttled: 2, ThrottledTime: time.Second, Quota: true}
	b := CgroupCPU{Version: 2, Path: "/kp", Periods: 30, Throttled: 17, ThrottledTime: 3 * time.Second, Quota: true}
	d, ok := b.Sub(a)
	if !ok || d.Periods != 20 || d.Throttled != 15 || d.ThrottledTime != 2*time.Second {
		t.Errorf("%+v %v", d, ok)
	}
	if _, ok := a.Sub(b); ok {
		t.Error("counter went down: ok")
	}
	c := b
	c.Path = "/other"
	if _, ok := c.Sub(a); ok {
		t.Error("other cgroup: ok")
	}
}

func TestParseProcCgroupAndCandidates(t *testing.T) {
	hybrid := "12:cpu,cpuacct:/kubepods/pod1/abc\n4:memory:/kubepods/pod1/abc\n0::/kubepods/pod1/abc\ngarbage\nx:cpu:/y\n"
	lines, err := ParseProcCgroup(strings.NewReader(hybrid))
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 3 {
		t.Fatalf("lines %+v", lines)
	}
	c, err := CPUStatCandidates("/cg", lines)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, x := range c {
		got = append(got, x.File)
	}
	want := "/cg/cpu,cpuacct/kubepods/pod1/abc/cpu.stat /cg/cpu/kubepods/pod1/abc/cpu.stat /cg/kubepods/pod1/abc/cpu.stat /cg/unified/kubepods/pod1/abc/cpu.stat"
	if strings.Join(got, " ") != want {
		t.Errorf("candidates\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	// Outside the reader's cgroup namespace: refused, never read.
	lines, _ = ParseProcCgroup(strings.NewReader("0::/../../kubepods/x\n"))
	if _, err := CPUStatCandidates("/cg", lines); err == nil || !strings.Contains(err.Error(), "cgroup namespace") {
		t.Errorf("escape: %v", err)
	}
	if _, err := ParseProcCgroup(strings.NewReader("")); err == nil {
		t.Error("empty: no error")
	}
	for _, tc := range []struct {
		p    string
		up   int
		rest string
		ok   bool
	}{{"/../../a/b", 2, "a/b", true}, {"/a/b", 0, "", false}, {"/../a/../b", 0, "", false}, {"/..", 1, "", true}} {
		up, rest, ok := OutsidePath(tc.p)
		if up != tc.up || rest != tc.rest || ok != tc.ok {
			t.Errorf("OutsidePath(%q) = %d %q %v", tc.p, up, rest, ok)
		}
	}
}

func TestParseProcStat(t *testing.T) {
	in := "cpu  100 5 50 800 10 2 30 3 0 0\ncpu0 50 2 25 400 5 1 15 1 0 0\nintr 1 2 3\n"
	c, err := ParseProcStat(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if c.SoftIRQ != 30 || c.Total() != 1000 {
		t.Errorf("%+v total %d", c, c.Total())
	}
	later := c
	later.SoftIRQ += 50
	later.Idle += 50
	if s, ok := later.SoftIRQShare(c); !ok || s != 0.5 {
		t.Errorf("share %v %v", s, ok)
	}
	if _, ok := c.SoftIRQShare(c); ok {
		t.Error("no time passed: ok")
	}
	// An old kernel's four fields.
	if c, err := ParseProcStat(strings.NewReader("cpu 1 2 3 4\n")); err != nil || c.Total() != 10 {
		t.Errorf("four fields: %+v %v", c, err)
	}
	for _, bad := range []string{"", "cpu 1 2\n", "cpu a b c d\n", "intr 1\n"} {
		if _, err := ParseProcStat(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if (CPUTimes{User: 1<<64 - 1, Idle: 5}).Total() != 1<<64-1 {
		t.Error("Total wraps")
	}
}

// TestRealReadsFiles builds a proc root and a cgroup root in a temporary
// directory (v1 hybrid and v2) and reads them with the real adapter.
func TestRealReadsFiles(t *testing.T) {
	dir := t.TempDir()
	proc, cg := filepath.Join(dir, "proc"), filepath.Join(dir, "cgroup")
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(proc, "stat"), "cpu  1 0 1 7 0 0 1 0\ncpu0 1 0 1 7 0 0 1 0\n")
	write(filepath.Join(proc, "10", "cgroup"), "3:cpu:/kp\n0::/\n")
	write(filepath.Join(cg, "cpu", "kp", "cpu.stat"), "nr_periods 5\nnr_throttled 4\nthrottled_time 1000\n")
	write(filepath.Join(proc, "20", "cgroup"), "0::/kp2\n")
	write(filepath.Join(cg, "kp2", "cpu.stat"), "usage_usec 9\nnr_periods 7\nnr_throttled 1\nthrottled_usec 3\n")
	write(filepath.Join(proc, "30", "cgroup"), "0::/nocpu\n")
	write(filepath.Join(cg, "nocpu", "cpu.stat"), "usage_usec 9\n")
	r := New(Config{ProcRoot: proc, CgroupRoot: cg})
	ctx := context.Background()
	c, err := r.CgroupCPU(ctx, 10)
	if err != nil || c.Version != 1 || c.Path != "/kp" || c.Throttled != 4 {
		t.Errorf("v1: %+v %v", c, err)
	}
	c, err = r.CgroupCPU(ctx, 20)
	if err != nil || c.Version != 2 || c.Path != "/kp2" || c.ThrottledTime != 3*time.Microsecond {
		t.Errorf("v2: %+v %v", c, err)
	}
	if _, err := r.CgroupCPU(ctx, 30); err == nil || !strings.Contains(err.Error(), "cpu controller not enabled") {
		t.Errorf("no cpu controller: %v", err)
	}
	if _, err := r.CgroupCPU(ctx, 40); err == nil {
		t.Error("no such pid: no error")
	}
	n, err := r.NodeCPU(ctx)
	if err != nil || n.SoftIRQ != 1 {
		t.Errorf("node: %+v %v", n, err)
	}
	// This daemon in a private cgroup namespace two levels deep: init's
	// path climbs 2 levels, kube-proxy's (pid 60) too, then descends.
	write(filepath.Join(proc, "1", "cgroup"), "0::/../../init.scope\n")
	write(filepath.Join(proc, "60", "cgroup"), "0::/../../kubepods/kp60\n")
	write(filepath.Join(cg, "kubepods", "kp60", "cpu.stat"), "nr_periods 10\nnr_throttled 6\nthrottled_usec 1\n")
	c, err = r.CgroupCPU(ctx, 60)
	if err != nil || c.Path != "/kubepods/kp60" || c.Throttled != 6 {
		t.Errorf("outside the namespace, same depth: %+v %v", c, err)
	}
	// kube-proxy's path climbs 1 of the 2 levels: one level to search.
	write(filepath.Join(proc, "61", "cgroup"), "0::/../kp61\n")
	write(filepath.Join(cg, "pods", "kp61", "cpu.stat"), "nr_periods 10\nnr_throttled 2\nthrottled_usec 1\n")
	c, err = r.CgroupCPU(ctx, 61)
	if err != nil || c.Path != "/pods/kp61" || c.Throttled != 2 {
		t.Errorf("outside the namespace, one level searched: %+v %v", c, err)
	}
	// Two matches: ambiguous, refused.
	write(filepath.Join(cg, "other", "kp61", "cpu.stat"), "nr_periods 10\n")
	if _, err := r.CgroupCPU(ctx, 61); err == nil || !strings.Contains(err.Error(), "cgroup namespace") {
		t.Errorf("ambiguous: %v", err)
	}
	// An oversized file is refused, not read whole.
	write(filepath.Join(proc, "50", "cgroup"), "0::/big\n")
	write(filepath.Join(cg, "big", "cpu.stat"), strings.Repeat("nr_periods 1\n", maxFile))
	if _, err := r.CgroupCPU(ctx, 50); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized: %v", err)
	}
}

// TestRealQuotaOnAnAncestor: the kernel counts periods and throttling only
// in the group whose quota is enforced (seen on a real v2 kernel in
// TestVMCgroupV2Throttling): a process whose own group has no quota but
// whose pod or slice has one is read from that ancestor, the nearest one
// with a quota; with a quota of its own, or none anywhere, from its own.
func TestRealQuotaOnAnAncestor(t *testing.T) {
	dir := t.TempDir()
	proc, cg := filepath.Join(dir, "proc"), filepath.Join(dir, "cgroup")
	write := func(p, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	zero := "usage_usec 900\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"
	// v2: kubepods (no quota) / pod (quota) / ctr (no quota).
	write(filepath.Join(cg, "kubepods", "cpu.max"), "max 100000\n")
	write(filepath.Join(cg, "kubepods", "cpu.stat"), zero)
	write(filepath.Join(cg, "kubepods", "pod", "cpu.max"), "5000 100000\n")
	write(filepath.Join(cg, "kubepods", "pod", "cpu.stat"), "usage_usec 800\nnr_periods 40\nnr_throttled 38\nthrottled_usec 3600000\n")
	write(filepath.Join(cg, "kubepods", "pod", "ctr", "cpu.max"), "max 100000\n")
	write(filepath.Join(cg, "kubepods", "pod", "ctr", "cpu.stat"), zero)
	write(filepath.Join(proc, "10", "cgroup"), "0::/kubepods/pod/ctr\n")
	// v1: the same with cfs_quota_us.
	write(filepath.Join(cg, "cpu", "kubepods", "pod", "cpu.cfs_quota_us"), "5000\n")
	write(filepath.Join(cg, "cpu", "kubepods", "pod", "cpu.stat"), "nr_periods 40\nnr_throttled 20\nthrottled_time 5\n")
	write(filepath.Join(cg, "cpu", "kubepods", "pod", "ctr", "cpu.cfs_quota_us"), "-1\n")
	write(filepath.Join(cg, "cpu", "kubepods", "pod", "ctr", "cpu.stat"), "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
	write(filepath.Join(proc, "11", "cgroup"), "1:cpu:/kubepods/pod/ctr\n0::/\n")
	r := New(Config{ProcRoot: proc, CgroupRoot: cg})
	ctx := context.Background()
	c, err := r.CgroupCPU(ctx, 10)
	if err != nil || c.Path != "/kubepods/pod" || c.Periods != 40 || c.Throttled != 38 || c.ThrottledTime != 3600*time.Millisecond {
		t.Errorf("v2, quota on the pod: %+v %v", c, err)
	}
	c, err = r.CgroupCPU(ctx, 11)
	if err != nil || c.Version != 1 || c.Path != "/kubepods/pod" || c.Throttled != 20 {
		t.Errorf("v1, quota on the pod: %+v %v", c, err)
	}
	// A quota of its own: its own counters, though the pod has one too;
	// seen once the memoised answer expires (limitTTL), not before.
	write(filepath.Join(cg, "kubepods", "pod", "ctr", "cpu.max"), "2000 100000\n")
	write(filepath.Join(cg, "kubepods", "pod", "ctr", "cpu.stat"), "nr_periods 7\nnr_throttled 1\nthrottled_usec 1\n")
	if c, err := r.CgroupCPU(ctx, 10); err != nil || c.Path != "/kubepods/pod" {
		t.Errorf("within limitTTL: %+v %v, want the memoised pod", c, err)
	}
	expire := func() {
		r.mu.Lock()
		for k, e := range r.limits {
			e.at = e.at.Add(-limitTTL)
			r.limits[k] = e
		}
		r.mu.Unlock()
	}
	expire()
	if c, err := r.CgroupCPU(ctx, 10); err != nil || c.Path != "/kubepods/pod/ctr" || c.Periods != 7 {
		t.Errorf("own quota: %+v %v", c, err)
	}
	// No quota anywhere: its own zeros (not throttled, truthfully).
	write(filepath.Join(cg, "kubepods", "pod", "ctr", "cpu.max"), "max 100000\n")
	write(filepath.Join(cg, "kubepods", "pod", "ctr", "cpu.stat"), zero)
	write(filepath.Join(cg, "kubepods", "pod", "cpu.max"), "max 100000\n")
	expire()
	if c, err := r.CgroupCPU(ctx, 10); err != nil || c.Path != "/kubepods/pod/ctr" || c.Periods != 0 || !c.Quota {
		t.Errorf("no quota: %+v %v", c, err)
	}
	// An unreadable or hostile cpu.max ends the search: own counters.
	write(filepath.Join(cg, "kubepods", "pod", "cpu.max"), "lots\n")
	expire()
	if c, err := r.CgroupCPU(ctx, 10); err != nil || c.Path != "/kubepods/pod/ctr" {
		t.Errorf("hostile cpu.max: %+v %v", c, err)
	}
	// The ancestor's group gone (the pod re-created): its own counters.
	write(filepath.Join(cg, "kubepods", "pod", "cpu.max"), "5000 100000\n")
	expire()
	if c, err := r.CgroupCPU(ctx, 10); err != nil || c.Path != "/kubepods/pod" {
		t.Errorf("pod quota again: %+v %v", c, err)
	}
	if err := os.Remove(filepath.Join(cg, "kubepods", "pod", "cpu.stat")); err != nil {
		t.Fatal(err)
	}
	if c, err := r.CgroupCPU(ctx, 10); err != nil || c.Path != "/kubepods/pod/ctr" {
		t.Errorf("pod's cpu.stat gone: %+v %v", c, err)
	}
}

func TestParseQuota(t *testing.T) {
	for _, tc := range []struct {
		v    int
		in   string
		want bool
		err  bool
	}{{2, "max 100000\n", false, false}, {2, "5000 100000\n", true, false}, {2, "", false, true}, {2, "-5 100000", false, true},
		{1, "-1\n", false, false}, {1, "5000\n", true, false}, {1, "max", false, true}} {
		got, err := ParseQuota(tc.v, []byte(tc.in))
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("ParseQuota(%d, %q) = %v, %v", tc.v, tc.in, got, err)
		}
	}
}

func FuzzParseQuota(f *testing.F) {
	f.Add(2, []byte("5000 100000\n"))
	f.Add(1, []byte("-1\n"))
	f.Fuzz(func(t *testing.T, v int, b []byte) {
		if q, err := ParseQuota(v, b); err != nil && q {
			t.Fatalf("quota with an error: %q", b)
		}
	})
}

func FuzzParseCPUStat(f *testing.F) {
	f.Add("usage_usec 2000000\nnr_periods 100\nnr_throttled 40\nthrottled_usec 3500000\n")
	f.Add("nr_periods 10\nnr_throttled 3\nthrottled_time 250000000\n")
	f.Add("nr_periods 99999999999999999999\n")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseCPUStat(2, strings.NewReader(s))
		if err == nil && c.ThrottledTime < 0 {
			t.Fatalf("negative time %+v", c)
		}
	})
}

func FuzzParseProcCgroup(f *testing.F) {
	f.Add("12:cpu,cpuacct:/kubepods/pod1/abc\n0::/kubepods/pod1/abc\n")
	f.Add("0::/../../x\n")
	f.Add("1:cpu:/a/./b/../c\n")
	f.Fuzz(func(t *testing.T, s string) {
		lines, err := ParseProcCgroup(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, l := range lines {
			if _, rest, ok := OutsidePath(l.Path); ok && slices.Contains(strings.Split(rest, "/"), "..") {
				t.Fatalf("OutsidePath(%q) rest %q climbs again", l.Path, rest)
			}
		}
		c, err := CPUStatCandidates("/cg", lines)
		if err != nil {
			return
		}
		for _, x := range c {
			if !strings.HasPrefix(x.File, "/cg/") || filepath.Clean(x.File) != x.File {
				t.Fatalf("candidate %q leaves the root", x.File)
			}
		}
	})
}

func FuzzParseProcStat(f *testing.F) {
	f.Add("cpu  100 5 50 800 10 2 30 3 0 0\ncpu0 1 2 3 4\n")
	f.Add("cpu 18446744073709551615 18446744073709551615 1 1 1 1 1 1\n")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseProcStat(strings.NewReader(s))
		if err != nil {
			return
		}
		if sh, ok := c.SoftIRQShare(CPUTimes{}); ok && (sh < 0 || sh > 1) {
			t.Fatalf("share %v of %+v", sh, c)
		}
	})
}

// BenchmarkRealSample is the per-cycle cost of the likely-cause figures on
// this machine: /proc/stat and this process's cgroup cpu.stat (what a
// detector reads each cycle once kube-proxy's process is known).
func BenchmarkRealSample(b *testing.B) {
	r := New(Config{})
	ctx := context.Background()
	pid := int32(os.Getpid())
	if _, err := r.CgroupCPU(ctx, pid); err != nil {
		b.Skipf("no cpu.stat with throttling counters for this process: %v", err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.NodeCPU(ctx); err != nil {
			b.Fatal(err)
		}
		if _, err := r.CgroupCPU(ctx, pid); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRealSampleNoQuota is CgroupCPU for a process four levels deep
// (kubelet's kubepods/<qos>/<pod>/<container>) with no quota anywhere: its
// own cpu.stat and every level's cpu.max (the most reads limiting makes),
// on a file tree.
func BenchmarkRealSampleNoQuota(b *testing.B) {
	dir := b.TempDir()
	proc, cg := filepath.Join(dir, "proc"), filepath.Join(dir, "cgroup")
	p := filepath.Join(cg, "kubepods", "burstable", "pod1", "ctr")
	if err := os.MkdirAll(p, 0o755); err != nil {
		b.Fatal(err)
	}
	for d := p; d != cg; d = filepath.Dir(d) {
		if err := os.WriteFile(filepath.Join(d, "cpu.max"), []byte("max 100000\n"), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(p, "cpu.stat"), []byte("usage_usec 1\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(proc, "7"), 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(proc, "7", "cgroup"), []byte("0::/kubepods/burstable/pod1/ctr\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	r := New(Config{ProcRoot: proc, CgroupRoot: cg})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if c, err := r.CgroupCPU(ctx, 7); err != nil || c.Path != "/kubepods/burstable/pod1/ctr" {
			b.Fatal(c, err)
		}
	}
}
