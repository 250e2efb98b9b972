package iptables

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func TestParseSchedStat(t *testing.T) {
	for in, want := range map[string]schedStat{
		"1500000 2000000000 12\n":  {cpu: 1500 * time.Microsecond, runDelay: 2 * time.Second, ok: true},
		"5 6":                      {cpu: 5, runDelay: 6, ok: true},
		"":                         {},
		"5":                        {},
		"-1 2 3":                   {},
		"1 99999999999999999999 3": {},
		"x y z":                    {},
	} {
		if got := parseSchedStat(in); got != want {
			t.Errorf("%q: %+v, want %+v", in, got, want)
		}
	}
}

// FuzzParseSchedStat: any content parses without panic, to a non-negative
// pair or not ok.
func FuzzParseSchedStat(f *testing.F) {
	for _, s := range []string{"1 2 3\n", "", "18446744073709551615 1 1", "1 -2 3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got := parseSchedStat(s); got.ok && (got.cpu < 0 || got.runDelay < 0) {
			t.Fatalf("%q: %+v", s, got)
		}
	})
}

// TestRealSaveStarvedIsNotASlowSave: a save that does not finish in its
// timeout because it waits for a CPU (here: pinned to CPU 0 at nice 19
// beside three spinning processes at nice -20) is ErrStarved, not a
// deadline (which IPTablesRules reports as a critical slow save: the
// daemon's own starvation is not the node's rules); one that is blocked
// (sleeping: not waiting for a CPU) stays a deadline. The spinners run
// for 1.5 s on one CPU.
func TestRealSaveStarvedIsNotASlowSave(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (nice -20)")
	}
	for _, c := range []string{"taskset", "nice", "iptables-nft-save"} {
		if _, err := exec.LookPath(c); err != nil {
			t.Skipf("needs %s", c)
		}
	}
	var spinners []*exec.Cmd
	for i := 0; i < 3; i++ {
		spin := exec.Command("taskset", "-c", "0", "nice", "-n", "-20", "sh", "-c", "while :; do :; done")
		spin.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := spin.Start(); err != nil {
			t.Fatal(err)
		}
		spinners = append(spinners, spin)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			for _, s := range spinners { // by PID: taskset, nice and sh are one process
				_ = s.Process.Kill()
				_ = s.Wait()
			}
		})
	}
	t.Cleanup(stop)
	// Past the save's 1 s timeout: the starved save, killed, is scheduled
	// to die once they are gone.
	time.AfterFunc(1500*time.Millisecond, stop)
	// taskset and nice exec the spinning shell: the save's PID spins.
	r := New(Config{Prefix: []string{"taskset", "-c", "0", "nice", "-n", "19", "sh", "-c", "while :; do :; done", "--"}, Timeout: time.Second})
	_, err := r.Save(context.Background(), IPv4, NFT)
	if !errors.Is(err, ErrStarved) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for one") {
		t.Fatalf("a save starved of CPU: %v, want ErrStarved and no deadline", err)
	}
	t.Log(err)

	r = New(Config{Prefix: []string{"sh", "-c", "sleep 5", "--"}, Timeout: 300 * time.Millisecond})
	if _, err := r.Save(context.Background(), IPv4, NFT); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrStarved) {
		t.Fatalf("a blocked save: %v, want a deadline", err)
	}
}
