package memlimit

import (
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
)

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestCgroupLimit(t *testing.T) {
	v2 := t.TempDir()
	write(t, v2+"/memory.max", "max\n")
	write(t, v2+"/kubepods/pod1/memory.max", "536870912\n")
	write(t, v2+"/kubepods/pod1/c1/memory.max", "201326592\n")
	write(t, v2+"/kubepods/pod2/c2/memory.max", "max\n")
	v1 := t.TempDir()
	write(t, v1+"/memory/memory.limit_in_bytes", "9223372036854771712\n")
	write(t, v1+"/memory/kubepods/c3/memory.limit_in_bytes", "104857600\n")
	for _, c := range []struct {
		name, root, self string
		want             int64
	}{
		{"v2 container", v2, "0::/kubepods/pod1/c1\n", 201326592},
		{"v2 limit on the parent", v2, "0::/kubepods/pod1/other\n", 536870912},
		{"v2 namespaced: own cgroup is the root", v2 + "/kubepods/pod1/c1", "0::/\n", 201326592},
		{"v2 no limit", v2, "0::/kubepods/pod2/c2\n", 0},
		{"v1", v1, "12:cpu,cpuacct:/x\n4:memory:/kubepods/c3\n", 104857600},
		{"v1 unlimited", v1, "4:memory:/\n", 0},
		{"nothing", v2, "garbage\n", 0},
	} {
		got, err := CgroupLimit(c.root, []byte(c.self))
		if got != c.want || (c.want == 0) != (err != nil) {
			t.Errorf("%s: %d %v, want %d", c.name, got, err, c.want)
		}
	}
}

func TestSetLeavesGOMEMLIMITAndGOGC(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "150MiB")
	t.Setenv("GOGC", "80")
	before := debug.SetMemoryLimit(-1)
	gc := debug.SetGCPercent(80)
	defer debug.SetGCPercent(gc)
	if r := Set(t.TempDir()); r.Limit != 0 || r.GCPercent != 0 || debug.SetMemoryLimit(-1) != before || debug.SetGCPercent(80) != 80 {
		t.Fatalf("%+v", r)
	}
	t.Setenv("GOGC", "")
	if r := Set(t.TempDir()); r.GCPercent != GCPercent || debug.SetGCPercent(gc) != GCPercent {
		t.Fatalf("GOGC unset: %+v", r)
	}
}

func TestSetFromCgroup(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip(err)
	}
	root := t.TempDir()
	// This process's cgroup path, with a 100 MiB limit under a fake root
	// (v1's memory controller when it has one, else v2).
	file := ""
	for _, l := range splitLines(string(self)) {
		f := strings.SplitN(l, ":", 3)
		switch {
		case len(f) == 3 && slices.Contains(strings.Split(f[1], ","), "memory"):
			file = filepath.Join(root, "memory", f[2], "memory.limit_in_bytes")
		case len(f) == 3 && f[0] == "0" && f[1] == "" && file == "":
			file = filepath.Join(root, f[2], "memory.max")
		}
	}
	if file == "" {
		t.Skip("no memory cgroup")
	}
	write(t, file, "104857600\n")
	before := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(before)
	r := Set(root)
	if r.Limit != 83886080 || debug.SetMemoryLimit(-1) != 83886080 {
		t.Fatalf("%+v, runtime limit %d", r, debug.SetMemoryLimit(-1))
	}
}

func splitLines(s string) []string {
	var out []string
	for len(s) > 0 {
		i := 0
		for i < len(s) && s[i] != '\n' {
			i++
		}
		out = append(out, s[:i])
		if i < len(s) {
			i++
		}
		s = s[i:]
	}
	return out
}
