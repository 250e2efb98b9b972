//go:build linux

package conntrack

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// TestCaptureFixtures regenerates testdata/*.bin from the real kernel when
// REMEDIATE_CAPTURE_FIXTURES=1: raw ctnetlink datagrams (a filtered dump
// and the statistics replies) that seed the decoder tests and fuzz targets.
func TestCaptureFixtures(t *testing.T) {
	if os.Getenv("REMEDIATE_CAPTURE_FIXTURES") != "1" {
		t.Skip("set REMEDIATE_CAPTURE_FIXTURES=1 to re-capture testdata from the kernel")
	}
	r, _, _ := setupTable(t)
	ctx := context.Background()
	s, err := openSock(r.cfg.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	capture := func(name string, seq uint32) {
		if err := s.send(ctx, s.enc.b); err != nil {
			t.Fatal(err)
		}
		b, err := s.recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("testdata", name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		// Drain the rest of the reply.
		for {
			h, _, rest, err := nextMessage(b)
			if err != nil {
				t.Fatal(err)
			}
			if h.Type == nlmsgDone || h.Type == nlmsgError {
				return
			}
			b = rest
			if len(b) == 0 {
				if b, err = s.recv(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	s.enc.reset()
	s.enc.dumpRequest(s.nextSeq(), s.pid, Backend{IP: deadIP}, true)
	capture("dump-udp-reply-src-v4.bin", s.seq)
	s.enc.reset()
	s.enc.dumpRequest(s.nextSeq(), s.pid, Backend{IP: netip.MustParseAddr("fd00:1::1")}, true)
	capture("dump-udp-v6.bin", s.seq)
	s.enc.reset()
	s.enc.statsRequest(s.nextSeq(), s.pid, ctMsgGetStatsCPU)
	capture("stats-cpu.bin", s.seq)
	s.enc.reset()
	off := s.enc.begin(msgType(ctMsgGetStats), nlmFRequest|nlmFAck, s.nextSeq(), s.pid, 0)
	s.enc.end(off)
	capture("stats-global.bin", s.seq)
}
