package probe

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestConnectLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan int, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b, _ := io.ReadAll(c) // EOF once the prober closes
		got <- len(b)
	}()
	d := New(Options{})
	addr := netip.MustParseAddrPort(l.Addr().String())
	r := d.Connect(context.Background(), addr, 2*time.Second)
	if !r.OK() || r.Err != nil || r.Addr != addr {
		t.Fatalf("connect to a listener: %+v", r)
	}
	if n := <-got; n != 0 {
		t.Fatalf("the server read %d bytes: the probe must send no payload", n)
	}

	// A closed port on loopback answers with a reset.
	l2, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := netip.MustParseAddrPort(l2.Addr().String())
	l2.Close()
	if r := d.Connect(context.Background(), closed, 2*time.Second); r.Outcome != Refused || r.Err == nil {
		t.Fatalf("closed port: %+v", r)
	}
	// IPv6 loopback, when the kernel has it.
	if l6, err := net.Listen("tcp", "[::1]:0"); err == nil {
		defer l6.Close()
		go func() {
			if c, err := l6.Accept(); err == nil {
				c.Close()
			}
		}()
		if r := d.Connect(context.Background(), netip.MustParseAddrPort(l6.Addr().String()), 2*time.Second); !r.OK() {
			t.Fatalf("IPv6 loopback: %+v", r)
		}
	}
	if r := d.Connect(context.Background(), netip.AddrPort{}, time.Second); r.Outcome != Failed {
		t.Fatalf("invalid address: %+v", r)
	}
}

// hang is a dial that never answers: only the context ends it.
func hang(ctx context.Context, _, _ string) (net.Conn, error) {
	<-ctx.Done()
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
}

func TestConnectTimeoutAndAbort(t *testing.T) {
	d := New(Options{Dial: hang})
	addr := netip.MustParseAddrPort("10.96.0.1:443")
	start := time.Now()
	r := d.Connect(context.Background(), addr, 100*time.Millisecond)
	if r.Outcome != Timeout || r.Latency < 100*time.Millisecond || time.Since(start) > 2*time.Second {
		t.Fatalf("timeout: %+v after %v", r, time.Since(start))
	}
	if s := r.String(); s == "" || s[:7] != "timeout" {
		t.Fatalf("String: %q", s)
	}
	// The caller's deadline before the connect timeout: aborted, not a
	// timeout of the path.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if r := d.Connect(ctx, addr, 5*time.Second); r.Outcome != Aborted {
		t.Fatalf("caller's deadline: %+v", r)
	}
	if r := d.Connect(ctx, addr, 5*time.Second); r.Outcome != Aborted {
		t.Fatalf("already done: %+v", r)
	}
}

func TestRef(t *testing.T) {
	for _, r := range []Ref{
		{Family: "IPv4", Namespace: "default", Name: "kubernetes", Port: 443},
		{Family: "IPv6", Namespace: "team-a", Name: "canary", Port: 8080},
	} {
		got, err := ParseRef(r.Target())
		if err != nil || got != r {
			t.Fatalf("%s: %+v %v", r.Target(), got, err)
		}
	}
	if got := (Ref{Family: "IPv4", Namespace: "default", Name: "kubernetes", Port: 443}).Target(); got != "service-path/IPv4/default/kubernetes:443" {
		t.Fatalf("target %q", got)
	}
	for _, bad := range []string{"", "service-path/", "service-path/IPv5/a/b:1", "service-path/IPv4/a/b", "service-path/IPv4/a/b:0",
		"service-path/IPv4/a/b:70000", "service-path/IPv4//b:1", "dataplane/IPv4/a/b:1", "service-path/IPv4/a/b/c:1"} {
		if _, err := ParseRef(bad); err == nil {
			t.Errorf("ParseRef(%q) accepted", bad)
		}
	}
}

func FuzzParseRef(f *testing.F) {
	f.Add("service-path/IPv4/default/kubernetes:443")
	f.Add("service-path/IPv6/x/y:1")
	f.Add("service-path/IPv4/a/b:")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			return
		}
		if again, err := ParseRef(r.Target()); err != nil || again != r {
			t.Fatalf("%q -> %+v -> %q -> %+v %v", s, r, r.Target(), again, err)
		}
	})
}
