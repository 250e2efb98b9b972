package finding

import (
	"encoding/json"
	"testing"
)

func TestEvidenceDecoders(t *testing.T) {
	ev := map[string]any{"i": 53, "u16": uint16(53), "f": float64(53), "n": json.Number("53"), "s": "53",
		"frac": 53.5, "neg": -1, "big": 70000, "str": "x", "empty": "", "hold": 45.5, "bool": true}
	for _, k := range []string{"i", "u16", "f", "n", "s"} {
		if v, err := EvidenceInt(ev, k); err != nil || v != 53 {
			t.Errorf("EvidenceInt(%s) = %d, %v", k, v, err)
		}
		if v, err := EvidencePort(ev, k); err != nil || v != 53 {
			t.Errorf("EvidencePort(%s) = %d, %v", k, v, err)
		}
	}
	for _, k := range []string{"frac", "str", "bool", "missing"} {
		if _, err := EvidenceInt(ev, k); err == nil {
			t.Errorf("EvidenceInt(%s) accepted %v", k, ev[k])
		}
	}
	for _, k := range []string{"neg", "big"} {
		if _, err := EvidencePort(ev, k); err == nil {
			t.Errorf("EvidencePort(%s) accepted %v", k, ev[k])
		}
	}
	if v, err := EvidenceNumber(ev, "hold"); err != nil || v != 45.5 {
		t.Errorf("EvidenceNumber = %v, %v", v, err)
	}
	if _, err := EvidenceNumber(ev, "bool"); err == nil {
		t.Error("EvidenceNumber accepted a bool")
	}
	if s, err := EvidenceString(ev, "str"); err != nil || s != "x" {
		t.Errorf("EvidenceString = %q, %v", s, err)
	}
	for _, k := range []string{"empty", "i", "missing"} {
		if _, err := EvidenceString(ev, k); err == nil {
			t.Errorf("EvidenceString(%s) accepted %v", k, ev[k])
		}
	}
}

func TestSkip(t *testing.T) {
	err := Skip("no %s", "ipvs")
	if r, ok := IsSkip(err); !ok || r != "no ipvs" || err.Error() != "skipped: no ipvs" {
		t.Fatalf("IsSkip(%v) = %q, %v", err, r, ok)
	}
}
