package nftables

import (
	"context"
	"errors"
	"os"
	"testing"
)

func TestFake(t *testing.T) {
	ctx := context.Background()
	f := NewFake()
	s, err := f.ListRuleset(ctx)
	if err != nil || len(s.Ruleset.Tables) != 0 {
		t.Fatalf("empty fake: %+v %v", s, err)
	}
	b, err := os.ReadFile(fixture)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetRuleset(string(b)); err != nil {
		t.Fatal(err)
	}
	if err := f.AddRuleset(`{"nftables": [{"table": {"family": "inet", "name": "fw"}}, {"chain": {"family": "inet", "table": "fw", "name": "in", "type": "filter", "hook": "input", "prio": -300, "policy": "drop"}}]}`); err != nil {
		t.Fatal(err)
	}
	s, _ = f.ListRuleset(ctx)
	if len(s.Ruleset.Tables) != 3 || s.Seq != 2 {
		t.Fatalf("tables %d seq %d", len(s.Ruleset.Tables), s.Seq)
	}
	if !f.DeleteTable(FamilyIP, KubeProxyTableName) || f.DeleteTable(FamilyIP, KubeProxyTableName) {
		t.Error("DeleteTable: want true then false")
	}
	s, _ = f.ListRuleset(ctx)
	if s.Ruleset.Table(FamilyIP, KubeProxyTableName) != nil || s.Ruleset.Table(FamilyIP6, KubeProxyTableName) == nil {
		t.Error("delete removed the wrong table")
	}
	if _, err := f.ListTable(ctx, FamilyIP, KubeProxyTableName); !errors.Is(err, ErrNoTable) {
		t.Errorf("deleted table: %v", err)
	}
	if ts, err := f.ListTable(ctx, FamilyInet, "fw"); err != nil || len(ts.Ruleset.Tables) != 1 || len(ts.Ruleset.BaseChains()) != 1 {
		t.Errorf("ListTable fw: %v", err)
	}
	f.SetError(errors.New("boom"))
	if _, err := f.ListRuleset(ctx); err == nil {
		t.Error("SetError ignored")
	}
	f.SetError(nil)
	f.Unavailable = true
	if _, err := f.ListRuleset(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("unavailable: %v", err)
	}
	if f.Calls() != 7 {
		t.Errorf("calls %d", f.Calls())
	}
	if err := f.SetRuleset("junk"); err == nil {
		t.Error("junk accepted")
	}
}
