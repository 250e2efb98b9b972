package registry

import (
	"strings"
	"testing"
)

type spec struct {
	Name string
	Tags []string
}

func TestTypes(t *testing.T) {
	ts := NewTypes("pkg", "thing", func(s spec) string { return s.Name }, func(s spec) bool { return s.Name != "" })
	ts.Add(spec{Name: "b"}, func(s *spec) { s.Tags = append(s.Tags, "x") })
	ts.Add(spec{Name: "a"})
	if got, ok := ts.Get("b"); !ok || len(got.Tags) != 1 {
		t.Fatalf("Get(b) = %+v, %v", got, ok)
	}
	if all := ts.All(); len(all) != 2 || all[0].Name != "a" {
		t.Fatalf("All = %+v", all)
	}
	for _, c := range []struct {
		s    spec
		want string
	}{{spec{}, "pkg: incomplete registration"}, {spec{Name: "a"}, "duplicate thing type a"}} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(p.(string), c.want) {
					t.Errorf("Add(%+v) panicked with %v, want %q", c.s, p, c.want)
				}
			}()
			ts.Add(c.s)
		}()
	}
}

type dParams struct{ N int }

func (p *dParams) SetDefaults() { p.N = 3 }

func TestTyped(t *testing.T) {
	newParams, build := Typed("T", func(p *dParams, d string) (string, error) { return d + strings.Repeat("!", p.N), nil })
	p := newParams()
	if p.(*dParams).N != 3 {
		t.Fatalf("defaults not applied: %+v", p)
	}
	if got, err := build(p, "x"); err != nil || got != "x!!!" {
		t.Fatalf("build = %q, %v", got, err)
	}
	if _, err := build(&struct{}{}, "x"); err == nil {
		t.Fatal("foreign params accepted")
	}
	if q := NewParams[struct{ A int }](); q.A != 0 {
		t.Fatal("zero value expected without SetDefaults")
	}
}
