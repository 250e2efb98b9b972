package main

import (
	"os"
	"os/exec"
	"time"
)

// interruptAndWait stops a daemon the test started as the operator would
// (SIGINT), waits up to grace for it to exit, then kills it; it is reaped
// either way.
func interruptAndWait(cmd *exec.Cmd, grace time.Duration) {
	_ = cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}
