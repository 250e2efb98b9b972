package ipvs

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseConnsFixture(t *testing.T) {
	f, err := os.Open("testdata/ip_vs_conn")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []Conn
	if err := ParseConns(context.Background(), f, "", func(c Conn) error { got = append(got, c); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 8 {
		t.Fatalf("got %d entries, want 8", len(got))
	}
	want0 := Conn{
		Protocol: "UDP",
		Client:   netip.MustParseAddrPort("10.0.0.5:54177"),
		Virtual:  netip.MustParseAddrPort("10.96.0.10:53"),
		Dest:     netip.MustParseAddrPort("10.244.0.12:53"),
		State:    "UDP",
		Expires:  297 * time.Second,
	}
	if got[0] != want0 {
		t.Errorf("entry 0 = %+v, want %+v", got[0], want0)
	}
	if got[4].Protocol != "TCP" || got[4].Virtual.Port() != 443 || got[4].Dest.Port() != 6443 || got[4].State != "TIME_WAIT" {
		t.Errorf("entry 4 = %+v", got[4])
	}
	if !got[5].Template() || got[5].State != "ASSURED" || got[5].Expires != 10795*time.Second {
		t.Errorf("entry 5 should be an ASSURED template: %+v", got[5])
	}
	if got[0].Template() {
		t.Errorf("entry 0 is not a template")
	}
	if got[6].PEName != "sip" || got[6].PEData != "8a3c@example.test" {
		t.Errorf("entry 6 persistence engine = %q %q", got[6].PEName, got[6].PEData)
	}
	if got[7].Client != netip.MustParseAddrPort("[fd00::5]:49153") || got[7].Dest != netip.MustParseAddrPort("[fd00::1:c]:53") {
		t.Errorf("entry 7 (IPv6) = %+v", got[7])
	}
}

func TestParseConnsProtocolFilter(t *testing.T) {
	f, err := os.Open("testdata/ip_vs_conn")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	err = ParseConns(context.Background(), f, UDP, func(c Conn) error {
		if c.Protocol != UDP {
			t.Errorf("filter let through %+v", c)
		}
		n++
		return nil
	})
	if err != nil || n != 6 {
		t.Fatalf("n=%d err=%v, want 6 UDP entries", n, err)
	}
}

func TestParseConnLineErrors(t *testing.T) {
	for _, line := range []string{
		"UDP 0A000005 D3A1 0A60000A 0035 0AF4000C 0035 UDP",                   // no expires
		"UDP 0A00005 D3A1 0A60000A 0035 0AF4000C 0035 UDP 297",                // 7 hex digits
		"UDP 0A000005 D3A 0A60000A 0035 0AF4000C 0035 UDP 297",                // 3-digit port
		"UDP 0A000005 D3A1 0A60000A 0035 0AF4000C 0035 UDP -1",                // negative expiry
		"UDP 0A000005 ZZZZ 0A60000A 0035 0AF4000C 0035 UDP 297",               // bad port
		"UDP 0A000005 D3A1 10.96.0.10 0035 0AF4000C 0035 UDP 297",             // dotted quad
		"UDP 0A000005 D3A1 0A60000A 0035 0A F4000C 0035 UDP 297",              // split address
		"UDP fe80::1%eth0 D3A1 0A60000A 0035 0AF4000C 0035 UDP 297",           // zone
		"UDP 0A000005 D3A1 0A60000A 0035 0AF4000C 0035 UDP 99999999999999999", // overflow
	} {
		if c, err := ParseConnLine(line); err == nil {
			t.Errorf("ParseConnLine(%q) = %+v, want error", line, c)
		}
	}
}

func TestParseConnsReportsLine(t *testing.T) {
	in := ConnHeader + "\nUDP 0A000005 D3A1 0A60000A 0035 0AF4000C 0035 UDP 1\nUDP garbage\n"
	err := ParseConns(context.Background(), strings.NewReader(in), "", func(Conn) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("err = %v, want one naming line 3", err)
	}
}

func TestParseConnsCallbackErrorStops(t *testing.T) {
	f, _ := os.Open("testdata/ip_vs_conn")
	defer f.Close()
	stop := errors.New("stop")
	n := 0
	err := ParseConns(context.Background(), f, "", func(Conn) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("n=%d err=%v", n, err)
	}
}

func TestReadConnsThroughProcRoot(t *testing.T) {
	root := t.TempDir()
	if _, err := ReadConns(context.Background(), root, UDP); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("missing file: err = %v, want ErrUnavailable", err)
	}
	if !strings.Contains(errString(ReadConns(context.Background(), root, UDP)), "IPVS unavailable") {
		t.Fatalf("error should say IPVS unavailable")
	}
	data, err := os.ReadFile("testdata/ip_vs_conn")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "ip_vs_conn"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	conns, err := ReadConns(context.Background(), root, UDP)
	if err != nil || len(conns) != 6 {
		t.Fatalf("got %d conns, err %v", len(conns), err)
	}
	empty, _ := os.ReadFile("testdata/ip_vs_conn.empty")
	_ = os.WriteFile(filepath.Join(root, "net", "ip_vs_conn"), empty, 0o644)
	conns, err = ReadConns(context.Background(), root, "")
	if err != nil || len(conns) != 0 {
		t.Fatalf("empty table: %d conns, err %v", len(conns), err)
	}
}

func errString[T any](_ T, err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// FuzzParseConnLine checks that the parser never panics and that what it
// accepts is well formed and round-trips through the kernel's format.
func FuzzParseConnLine(f *testing.F) {
	data, err := os.ReadFile("testdata/ip_vs_conn")
	if err != nil {
		f.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		f.Add(l)
	}
	f.Add("UDP 0A000005 D3A1 0A60000A 0035 0AF4000C 0035 UDP 297 x")
	f.Fuzz(func(t *testing.T, line string) {
		c, err := ParseConnLine(line)
		if err != nil {
			return
		}
		if !c.Client.Addr().IsValid() || !c.Virtual.Addr().IsValid() || !c.Dest.Addr().IsValid() {
			t.Fatalf("accepted invalid addresses: %q -> %+v", line, c)
		}
		if c.Expires < 0 || c.Protocol == "" || c.State == "" {
			t.Fatalf("accepted bad fields: %q -> %+v", line, c)
		}
		// Whole-table parsing agrees with the line parser.
		n := 0
		err = ParseConns(context.Background(), strings.NewReader(ConnHeader+"\n"+line+"\n"), "", func(got Conn) error {
			n++
			if got != c {
				t.Fatalf("ParseConns %+v != ParseConnLine %+v", got, c)
			}
			return nil
		})
		if err != nil || n != 1 {
			t.Fatalf("ParseConns on accepted line %q: n=%d err=%v", line, n, err)
		}
	})
}

// BenchmarkParseConns measures parsing a 100k-entry table (half UDP) while
// keeping only the UDP entries, as IPVSUDPDeadBackend does.
func BenchmarkParseConns(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(ConnHeader + "\n")
	for i := 0; i < 100000; i++ {
		proto, state := "UDP", "UDP"
		if i%2 == 1 {
			proto, state = "TCP", "ESTABLISHED"
		}
		fmt.Fprintf(&sb, "%-3s %08X %04X %08X %04X %08X %04X %-11s %7d\n",
			proto, 0x0A000000+i, 1024+i%60000, 0x0A60000A, 53, 0x0AF40000+i%200, 53, state, i%300)
	}
	data := sb.String()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := 0
		if err := ParseConns(context.Background(), strings.NewReader(data), UDP, func(Conn) error { n++; return nil }); err != nil || n != 50000 {
			b.Fatalf("n=%d err=%v", n, err)
		}
	}
}
