package procs

import "testing"

func TestParseStat(t *testing.T) {
	s, err := parseStat([]byte("4242 (iptables-legacy) S 4200 4242 4200 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 2269184 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n"))
	if err != nil || s.comm != "iptables-legacy" || s.state != "S" || s.ppid != 4200 || s.startTick != 123456 {
		t.Fatalf("got %+v %v", s, err)
	}
	s, err = parseStat([]byte("4242 (nft) R 4200 4242 4200 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 1 0 123456 2269184 300"))
	if err != nil || s.cpuTicks != 1290 {
		t.Fatalf("utime+stime: %+v %v", s, err)
	}
	s, err = parseStat([]byte("7 (a) b) c) D 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0"))
	if err != nil || s.comm != "a) b) c" || s.state != "D" || s.startTick != 99 {
		t.Fatalf("comm with parens: %+v %v", s, err)
	}
	for _, bad := range []string{"", "1 (x", "1 (x) S 1 2", "1 (x) S z 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0",
		"1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 0 0 0 20 0 1 0 99 0", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 18446744073709551615 1 0 0 20 0 1 0 99 0"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestStatState(t *testing.T) {
	const rest = " 1 12 12 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0"
	for in, want := range map[string]string{
		"12 (sh) R" + rest:            "R",
		"12 (a) R) S" + rest:          "S",
		"12 (x (R) y) R" + rest:       "R",
		"12 (iptables-save) D" + rest: "D",
	} {
		if got, err := StatState([]byte(in)); err != nil || got != want {
			t.Errorf("%q: %q %v, want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"12 (sh", "", "12 (sh) R 1 12"} {
		if _, err := StatState([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// FuzzParseStat: any content parses without panic; a parsed state is
// one field.
func FuzzParseStat(f *testing.F) {
	f.Add([]byte("4242 (nft) R 4200 4242 4200 0 -1 4194560 100 0 0 0 1234 56 0 0 20 0 1 0 123456 2269184 300"))
	f.Add([]byte("7 (a) b) c) D 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseStat(b)
		if err == nil && (s.state == "" || s.cpuTicks > 1<<63) {
			t.Fatalf("%q: %+v", b, s)
		}
	})
}
