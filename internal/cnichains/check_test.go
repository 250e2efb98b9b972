package cnichains

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/iptables"
)

// capture parses an agent's real iptables-legacy-save capture
// (detect/testdata/cniagents, see its README).
func capture(t testing.TB, agent string) *iptables.Ruleset {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "detect", "testdata", "cniagents", agent+".save"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := iptables.ParseString(string(b))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// flush is what `iptables -t T -F` does to every table: the chains stay,
// empty, built-in ones included.
func flush(rs *iptables.Ruleset) {
	for _, t := range rs.Tables {
		for _, c := range t.Chains {
			c.Rules = nil
		}
	}
}

// deleteChains is `iptables -t T -X` after -F: only the built-in chains
// are left.
func deleteChains(t testing.TB, rs *iptables.Ruleset) *iptables.Ruleset {
	var b strings.Builder
	for _, tb := range rs.Tables {
		b.WriteString("*" + tb.Name + "\n")
		for _, c := range tb.Chains {
			if c.Builtin() {
				b.WriteString(":" + c.Name + " " + c.Policy + " [0:0]\n")
			}
		}
		b.WriteString("COMMIT\n")
	}
	out, err := iptables.ParseString(b.String())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func kinds(ds []Defect) map[string]int {
	m := map[string]int{}
	for _, d := range ds {
		m[d.Kind]++
	}
	return m
}

// TestCapturesHealthy: every known agent's capture shows all its declared
// hooks and chains, and no defect.
func TestCapturesHealthy(t *testing.T) {
	for _, a := range Known() {
		t.Run(a.Name, func(t *testing.T) {
			rs := capture(t, a.Name)
			o := Observe(rs, a)
			for _, h := range a.Hooks {
				if _, ok := o.Hooks[h.Key()]; !ok {
					t.Errorf("capture lacks hook %s", h)
				}
				if _, ok := o.Chains[h.Table+"/"+h.To]; !ok {
					t.Errorf("chain %s/%s not observed", h.Table, h.To)
				}
			}
			if len(o.Hooks) != len(a.Hooks) {
				t.Errorf("hooks observed %v, declared %d", o.Hooks, len(a.Hooks))
			}
			if ds := Check(o, a, Seen{}); len(ds) != 0 {
				t.Errorf("healthy capture: %v", ds)
			}
			// Another agent's capture shows nothing of this one.
			other := "flannel"
			if a.Name == other {
				other = "calico"
			}
			if o := Observe(capture(t, other), a); !o.Empty() {
				t.Errorf("%s's capture observed as %s: %+v", other, a.Name, o)
			}
		})
	}
}

// TestFlushAndDelete: after -F every declared hook is missing (the chains
// are still there, no memory needed); after -X nothing of the agent is
// left, and only the memory of the healthy save tells.
func TestFlushAndDelete(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC)
	for _, a := range Known() {
		t.Run(a.Name, func(t *testing.T) {
			healthy := capture(t, a.Name)
			mem, _ := Remember(Seen{}, Observe(healthy, a), t0, time.Hour)
			withRules := 0 // an agent may leave some of its chains empty (Cilium's nat chains without masquerading)
			for _, c := range mem.Chains {
				if c.Rules > 0 {
					withRules++
				}
			}

			flushed := capture(t, a.Name)
			flush(flushed)
			ds := Check(Observe(flushed, a), a, Seen{})
			if k := kinds(ds); k[HookMissing] != len(a.Hooks) || len(ds) != len(a.Hooks) {
				t.Errorf("flushed, no memory: %v", ds)
			}
			ds = Check(Observe(flushed, a), a, mem)
			if k := kinds(ds); k[HookMissing] != len(a.Hooks) || k[ChainEmptied] != withRules || withRules == 0 {
				t.Errorf("flushed, with memory: %v", ds)
			}

			deleted := deleteChains(t, flushed)
			if ds := Check(Observe(deleted, a), a, Seen{}); len(ds) != 0 {
				t.Errorf("deleted, no memory: %v (nothing can tell)", ds)
			}
			ds = Check(Observe(deleted, a), a, mem)
			if k := kinds(ds); k[HookMissing] != len(a.Hooks) || k[ChainMissing] != len(a.Hooks) {
				t.Errorf("deleted, with memory: %v", ds)
			}
			for _, d := range ds {
				if !d.Remembered || !d.LastSeen.Equal(t0) {
					t.Errorf("defect %+v: want remembered, last seen %s", d, t0)
				}
			}
			t.Logf("%s: %s", a.Name, ds[0])

			// A flushed save does not refresh a chain that had rules: its
			// old count and time stay.
			m2, _ := Remember(mem, Observe(flushed, a), t0.Add(time.Minute), time.Hour)
			for k, c := range mem.Chains {
				if c.Rules > 0 && m2.Chains[k] != c {
					t.Errorf("a flushed save changed remembered %s: %+v", k, m2.Chains[k])
				}
			}
			// Not seen for forgetAfter: forgotten, and nothing is expected.
			m3, forgot := Remember(mem, Observe(deleted, a), t0.Add(2*time.Hour), time.Hour)
			if len(m3.Chains)+len(m3.Hooks) != 0 || len(forgot) != 2*len(a.Hooks) {
				t.Errorf("after forgetAfter: %+v, forgot %v", m3, forgot)
			}
		})
	}
}

// TestOneHookDeleted: a single jump removed (iptables -D) is reported
// alone, by name.
func TestOneHookDeleted(t *testing.T) {
	a, _ := Lookup("flannel")
	rs := capture(t, "flannel")
	rs.DeleteRules("nat", "POSTROUTING", func(r iptables.Rule) bool { return r.Target == "FLANNEL-POSTRTG" })
	ds := Check(Observe(rs, a), a, Seen{})
	want := []Defect{{Kind: HookMissing, Table: "nat", From: "POSTROUTING", Chain: "FLANNEL-POSTRTG"}}
	if !reflect.DeepEqual(ds, want) {
		t.Fatalf("got %+v, want %+v", ds, want)
	}
	if s := ds[0].String(); s != "nat POSTROUTING does not jump to FLANNEL-POSTRTG" {
		t.Errorf("String() = %q", s)
	}
}

// TestRememberBounded: a hostile save with thousands of agent chains
// hooked from built-ins does not grow the memory past MaxRemembered.
func TestRememberBounded(t *testing.T) {
	a, _ := Lookup("calico")
	var b strings.Builder
	b.WriteString("*filter\n:INPUT ACCEPT [0:0]\n")
	for i := 0; i < 1000; i++ {
		b.WriteString(":cali-x" + strings.Repeat("a", i%20) + string(rune('a'+i%26)) + itoa(i) + " - [0:0]\n")
	}
	for i := 0; i < 1000; i++ {
		b.WriteString("-A INPUT -j cali-x" + strings.Repeat("a", i%20) + string(rune('a'+i%26)) + itoa(i) + "\n")
	}
	b.WriteString("COMMIT\n")
	rs, err := iptables.ParseString(b.String())
	if err != nil {
		t.Fatal(err)
	}
	m, _ := Remember(Seen{}, Observe(rs, a), time.Now(), 0)
	if len(m.Chains) > MaxRemembered || len(m.Hooks) > MaxRemembered {
		t.Fatalf("memory grew to %d chains, %d hooks", len(m.Chains), len(m.Hooks))
	}
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	s := ""
	for ; i > 0; i /= 10 {
		s = string(rune('0'+i%10)) + s
	}
	return s
}

// BenchmarkObserveCheckRemember is one agent's per-save work in a cycle,
// on Calico's capture (the agent with the most hooks).
func BenchmarkObserveCheckRemember(b *testing.B) {
	a, _ := Lookup("calico")
	rs := capture(b, "calico")
	mem, _ := Remember(Seen{}, Observe(rs, a), time.Now(), time.Hour)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		o := Observe(rs, a)
		_ = Check(o, a, mem)
		mem, _ = Remember(mem, o, time.Now(), time.Hour)
	}
}
