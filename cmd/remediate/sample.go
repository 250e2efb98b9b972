package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// --once --sample: the detectors that judge across samples (rates,
// histogram deltas, growth, hold times; detect.Windowed) run twice, the
// sample duration apart, and the second pass is the report. The daemon
// gets the same from its cycles; one --once run used to see none of it.
const (
	// defaultSample: short enough for an on-call look (the whole run well
	// under a minute), long enough for kube-proxy's default minSyncPeriod
	// (1 s) batching and a few conntrack drops to show.
	defaultSample = 10 * time.Second
	// minSample: kube-proxy's scrapes are cached for this long
	// (kubeproxy.DefaultCacheTTL); a shorter sample would read the same
	// scrape twice and judge nothing.
	minSample = kubeproxy.DefaultCacheTTL
	// progressEvery is how often a terminal is told how long is left.
	progressEvery = 2 * time.Second
)

// checkSample validates --sample and the --once-only flags.
func checkSample(o *options) error {
	if o.sample < 0 || (o.sample > 0 && o.sample < minSample) {
		return usageErrorf("--sample must be 0 (one snapshot) or at least %s (kube-proxy scrapes are cached that long), got %s", minSample, o.sample)
	}
	if o.sample > 10*time.Minute {
		return usageErrorf("--sample must be at most 10m, got %s", o.sample)
	}
	if o.bundle != "" && !o.once {
		return usageErrorf("--bundle needs --once")
	}
	if o.bundleMaxMiB < 1 || o.bundleMaxMiB > 1024 {
		return usageErrorf("--bundle-max-mib must be between 1 and 1024, got %d", o.bundleMaxMiB)
	}
	return nil
}

// capForSamples caps the sample-counting criteria of p's detectors to the
// samples a --once run takes (detect.SampleCounted), and returns the rules
// it changed. Windows in time need no cap: a window keeps its oldest
// sample, so two samples closer together than the window are judged over
// the time between them (the finding says over how long).
func capForSamples(p *policy.Policy, n int) []string {
	var changed []string
	for i := range p.Rules {
		r := &p.Rules[i]
		if sc, ok := r.Detector.Params.(detect.SampleCounted); ok && sc.CapSamples(n) {
			changed = append(changed, r.Name)
		}
	}
	return changed
}

// takeFirstSample runs the windowed detectors once and waits d after they
// finished, telling a terminal how long is left. It returns what the report says about the
// sampling, or an error when ctx ends first.
func takeFirstSample(ctx context.Context, eng *remediate.Engine, d time.Duration, stderr io.Writer) (*remediate.SampleInfo, error) {
	rules := eng.Sample(ctx)
	if len(rules) == 0 {
		return nil, nil // nothing judges across samples: no reason to wait
	}
	// From the end of the first sample: its last read is then at least d
	// old at the second, so no cached answer (kube-proxy's, up to
	// minSample) is read twice.
	start := time.Now()
	tty := isTerminal(stderr)
	if tty {
		fmt.Fprintf(stderr, "remediate: first sample of %d rate/window checks taken; second in %s (--sample 0 skips)\n", len(rules), d.Round(time.Second))
	}
	deadline := start.Add(d)
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("interrupted while sampling: %w", ctx.Err())
		case <-timer.C:
			if tty {
				fmt.Fprintln(stderr, "remediate: taking the second sample")
			}
			return &remediate.SampleInfo{Seconds: d.Seconds(), Rules: rules}, nil
		case <-tick.C:
			if tty {
				fmt.Fprintf(stderr, "remediate: sampling, %s left\n", time.Until(deadline).Round(time.Second))
			}
		}
	}
}

// isTerminal reports whether w is a terminal (progress lines only go
// there: a script reading stderr gets none).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
