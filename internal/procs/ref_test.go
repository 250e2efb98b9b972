package procs

import "testing"

func TestRef(t *testing.T) {
	r := Ref{Pid: 1234, CreateTimeMs: 1763712000000}
	if r.Target() != "process/1234@1763712000000" || Target(1234, 1763712000000) != r.Target() {
		t.Fatalf("Target = %q", r.Target())
	}
	if got, err := ParseRef(r.Target()); err != nil || got != r {
		t.Fatalf("ParseRef = %+v, %v", got, err)
	}
	for _, bad := range []string{"conntrack/table", "process/12", "process/0@1", "process/-1@1", "process/1@0", "process/x@1", "process/99999999999@1"} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}

func FuzzParseRef(f *testing.F) {
	f.Add("process/1234@1763712000000")
	f.Add("process/1@")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err == nil {
			if back, err := ParseRef(r.Target()); err != nil || back != r {
				t.Fatalf("%q -> %+v does not round-trip: %+v %v", s, r, back, err)
			}
		}
	})
}
