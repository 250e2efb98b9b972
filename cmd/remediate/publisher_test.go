package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestPublisherDoesNotBlock: handing work to the publisher returns at once
// while a publication hangs; reports handed meanwhile are replaced by the
// newest, which runs after the hanging one; reload errors are kept.
func TestPublisherDoesNotBlock(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var p publisher
	p.start(ctx, zap.NewNop())
	release := make(chan struct{})
	var mu sync.Mutex
	var ran []string
	record := func(s string) func(context.Context) {
		return func(context.Context) { mu.Lock(); ran = append(ran, s); mu.Unlock() }
	}
	started := make(chan struct{})
	p.hand(func(context.Context) { close(started); <-release }, false)
	<-started
	done := make(chan struct{})
	go func() {
		p.hand(record("report-2"), false)
		p.hand(record("report-3"), false)
		p.hand(record("reload-error"), true)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a bound on a hang, not a timing
		t.Fatal("hand blocked while a publication hangs")
	}
	close(release)
	for {
		mu.Lock()
		n := len(ran)
		mu.Unlock()
		if n == 2 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if ran[0] != "reload-error" || ran[1] != "report-3" {
		t.Errorf("ran %v, want [reload-error report-3] (report-2 replaced)", ran)
	}
}
