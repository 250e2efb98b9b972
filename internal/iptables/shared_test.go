package iptables

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type blockingSave struct {
	calls   atomic.Int32
	release chan struct{}
	err     error
}

func (b *blockingSave) Save(ctx context.Context, f Family, be Backend) (*Snapshot, error) {
	b.calls.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if b.err != nil {
		return nil, b.err
	}
	return &Snapshot{Family: f, Backend: be, Rules: &Ruleset{}}, nil
}

func TestSharedCoalescesAndExpires(t *testing.T) {
	inner := &blockingSave{release: make(chan struct{})}
	s := NewShared(inner, time.Minute)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	var wg sync.WaitGroup
	snaps := make([]*Snapshot, 5)
	for i := range snaps {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			snap, err := s.Save(context.Background(), IPv4, Legacy)
			if err != nil {
				t.Error(err)
			}
			snaps[i] = snap
		}(i)
	}
	for inner.calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the others queue behind it
	close(inner.release)
	wg.Wait()
	if n := inner.calls.Load(); n != 1 {
		t.Fatalf("%d saves for 5 concurrent callers", n)
	}
	for _, sn := range snaps[1:] {
		if sn != snaps[0] {
			t.Fatal("callers got different snapshots")
		}
	}
	if _, err := s.Save(context.Background(), IPv4, Legacy); err != nil || inner.calls.Load() != 1 {
		t.Fatalf("fresh snapshot not reused: %v, %d saves", err, inner.calls.Load())
	}
	if _, err := s.Save(context.Background(), IPv6, Legacy); err != nil || inner.calls.Load() != 2 {
		t.Fatalf("other family shared: %v, %d saves", err, inner.calls.Load())
	}
	now = now.Add(2 * time.Minute)
	if _, err := s.Save(context.Background(), IPv4, Legacy); err != nil || inner.calls.Load() != 3 {
		t.Fatalf("expired snapshot reused: %v, %d saves", err, inner.calls.Load())
	}
}

func TestSharedDoesNotCacheErrorsAndHonoursCallerDeadline(t *testing.T) {
	boom := errors.New("boom")
	inner := &blockingSave{release: make(chan struct{}), err: boom}
	close(inner.release)
	s := NewShared(inner, time.Minute)
	for i := 1; i <= 2; i++ {
		if _, err := s.Save(context.Background(), IPv4, NFT); !errors.Is(err, boom) || int(inner.calls.Load()) != i {
			t.Fatalf("try %d: %v, %d saves", i, err, inner.calls.Load())
		}
	}
	hang := &blockingSave{release: make(chan struct{})}
	s = NewShared(hang, time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := s.Save(ctx, IPv4, NFT); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("hung save: %v after %v", err, time.Since(start))
	}
}

func TestSharedLastSnapshots(t *testing.T) {
	inner := &blockingSave{release: make(chan struct{})}
	close(inner.release)
	s := NewShared(inner, time.Minute)
	if got := s.LastSnapshots(); len(got) != 0 {
		t.Fatalf("before any save: %v", got)
	}
	for _, f := range []Family{IPv6, IPv4} {
		if _, err := s.Save(context.Background(), f, Legacy); err != nil {
			t.Fatal(err)
		}
	}
	inner.err = errors.New("boom")
	if _, err := s.Save(context.Background(), IPv4, NFT); err == nil {
		t.Fatal("no error")
	}
	got := s.LastSnapshots()
	if len(got) != 2 || got[0].Family != IPv4 || got[1].Family != IPv6 {
		t.Fatalf("last snapshots %+v: want IPv4 and IPv6 legacy, failed saves left out", got)
	}
	r, err := Parse(strings.NewReader("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A KUBE-SERVICES -j RETURN\nCOMMIT\n"))
	if err != nil {
		t.Fatal(err)
	}
	sn := &Snapshot{Rules: r}
	if sn.RuleCount("nat") != 2 || sn.RuleCount("filter") != 0 || (*Snapshot)(nil).RuleCount("nat") != 0 {
		t.Errorf("rule counts %d %d", sn.RuleCount("nat"), sn.RuleCount("filter"))
	}
}
