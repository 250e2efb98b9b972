package procs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const tcpSample = `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:280A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31337 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2810 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 31338 1 0000000000000000 100 0 0 10 0
   2: 0100007F:280A 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 40001 1 0000000000000000 20 4 30 10 -1
`

func TestParseTCPListeners(t *testing.T) {
	got, err := ParseTCPListeners(strings.NewReader(tcpSample), 10250)
	if err != nil || !slices.Equal(got, []uint64{31337}) {
		t.Fatalf("port 10250: %v %v", got, err)
	}
	if got, err := ParseTCPListeners(strings.NewReader(tcpSample), 10256); err != nil || !slices.Equal(got, []uint64{31338}) {
		t.Fatalf("port 10256: %v %v", got, err)
	}
	for _, bad := range []string{"h\n 0: x 0 0A 0 0 0 0 0 1\n", "h\n 0: 01:ZZZZ 0 0A 0 0 0 0 0 1\n", "h\n 0: 01:0050 0 0A 0 0 0 0 0 x\n", "h\n 0: 1\n"} {
		if _, err := ParseTCPListeners(strings.NewReader(bad), 80); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestScanTCP(t *testing.T) {
	// Real lines (x86-64): a listener on 127.0.0.1:10250 of uid 0, a
	// connection to it of uid 65534, and a dual-stack listener's
	// accepted IPv4 peer in tcp6.
	tcp := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:280A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 33507 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A1B2 0100007F:280A 01 00000000:00000000 00:00000000 00000000 65534        0 33508 1 0000000000000000 20 4 30 10 -1
`
	var got []TCPSocket
	if err := ScanTCP(strings.NewReader(tcp), func(s TCPSocket) bool { got = append(got, s); return true }); err != nil {
		t.Fatal(err)
	}
	want := []TCPSocket{
		{Local: netip.MustParseAddrPort("127.0.0.1:10250"), Remote: netip.MustParseAddrPort("0.0.0.0:0"), State: 0x0A, UID: 0, Inode: 33507},
		{Local: netip.MustParseAddrPort("127.0.0.1:41394"), Remote: netip.MustParseAddrPort("127.0.0.1:10250"), State: 0x01, UID: 65534, Inode: 33508},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	tcp6 := `  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:280A 0000000000000000FFFF00000100007F:A1B2 01 00000000:00000000 00:00000000 00000000     0        0 40001 1 0000000000000000 20 4 0 10 -1
`
	got = nil
	if err := ScanTCP(strings.NewReader(tcp6), func(s TCPSocket) bool { got = append(got, s); return true }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Local != netip.MustParseAddrPort("[::ffff:127.0.0.1]:10250") || got[0].UID != 0 {
		t.Fatalf("tcp6: %v", got)
	}
	for _, bad := range []string{"h\n0: 0100007F:280A\n", "h\n0: 0100007:280A 00000000:0000 0A 0 0 0 0 0\n", "h\n0: 0100007F:280A 00000000:0000 0A 0 0 0 -1 0\n"} {
		if err := ScanTCP(strings.NewReader(bad), func(TCPSocket) bool { return true }); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzScanTCP(f *testing.F) {
	f.Add("h\n   0: 0100007F:280A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 33507 1\n")
	f.Add("h\n   0: 0000000000000000FFFF00000100007F:280A 0000000000000000FFFF00000100007F:A1B2 01 0:0 0:0 0 0 0 1\n")
	f.Add("h\n0: x:y\n")
	f.Fuzz(func(t *testing.T, s string) {
		_ = ScanTCP(strings.NewReader(s), func(TCPSocket) bool { return true })
	})
}

func FuzzParseTCPListeners(f *testing.F) {
	f.Add([]byte(tcpSample), uint16(10250))
	f.Add([]byte("h\n"), uint16(0))
	f.Fuzz(func(t *testing.T, b []byte, port uint16) {
		inos, err := ParseTCPListeners(strings.NewReader(string(b)), port)
		for _, i := range inos {
			if i == 0 {
				t.Fatalf("inode 0 returned (err %v)", err)
			}
		}
	})
}

// TestRealOwnsListener: this test process's own listener is its own; a
// sleep's is not; nothing listening is not.
func TestRealOwnsListener(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := uint16(l.Addr().(*net.TCPAddr).Port)
	r := New("/proc")
	ctx := context.Background()
	if ok, err := r.OwnsListener(ctx, int32(os.Getpid()), port); err != nil || !ok {
		t.Fatalf("own listener: %v %v", ok, err)
	}
	if _, err := exec.LookPath("sleep"); err != nil {
		t.Skip("no sleep")
	}
	s := start(t, "sleep", "60")
	ok, err := r.OwnsListener(ctx, int32(s.Process.Pid), port)
	if os.Geteuid() != 0 && errors.Is(err, ErrNoPtrace) {
		return
	}
	if err != nil || ok {
		t.Fatalf("a sleep owns this test's listener: %v %v", ok, err)
	}
	l.Close()
	if ok, err := r.OwnsListener(ctx, int32(os.Getpid()), port); err != nil || ok {
		t.Fatalf("closed listener: %v %v", ok, err)
	}
}
