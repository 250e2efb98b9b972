package remediate

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/remediate-dev/remediate/internal/netnstest"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// fillDisk writes path until the filesystem is full (ENOSPC).
func fillDisk(t *testing.T, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v", err)
			}
			return
		}
	}
}

// TestDiskFullStateFollowsJournal (issue 27 item 4), on a real full
// filesystem: a 256 KiB tmpfs as the state dir fills up while an action
// runs. The journal's outcome line still fits in the page its file already
// has, the state file cannot be rewritten: the journal says executed, the
// state says pending (and its target still Firing). Once the disk frees,
// the next cycle takes the outcome from the journal: one source of truth,
// and no second action on the target.
func TestDiskFullStateFollowsJournal(t *testing.T) {
	netnstest.NeedRoot(t, "mounts a small tmpfs")
	h := newHarness(t)
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "remediate-hardact-diskfull", dir).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	j, err := journal.Open(dir, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	h.dir, h.opts.StateDir, h.opts.Journal = dir, dir, j
	e := h.engine(mustPolicy(t, enforceRule))
	setPresent("a", "process/1")
	filler := filepath.Join(dir, "filler")
	w.actHook["a"] = func() {
		// The outcome line (< 1 KiB) must fit in the journal's last page:
		// pad the journal past a page boundary while there is room.
		fi, err := os.Stat(j.Path())
		if err != nil {
			t.Error(err)
			return
		}
		if slack := 4096 - fi.Size()%4096; slack < 2048 {
			if err := j.Append(journal.Record{Time: h.clock.Now(), Kind: journal.KindNote, Summary: strings.Repeat("p", int(slack))}); err != nil {
				t.Error(err)
			}
		}
		fillDisk(t, filler)
	}
	_, err = e.Cycle(context.Background())
	if err == nil || !strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("cycle on a full disk: %v, want the state save to fail with ENOSPC", err)
	}
	recs, _ := journal.ReadAll(dir)
	if last := recs[len(recs)-1]; last.Kind != journal.KindOutcome || last.Outcome != string(OutcomeExecuted) {
		t.Fatalf("the journal's last record is %+v, want the executed outcome", last)
	}
	st, _ := (&Store{Dir: dir}).Load(h.clock.Now())
	if st.History[0].Outcome != historyPending || st.Targets["fix-it|process/1"].Phase != PhaseFiring {
		t.Fatalf("on disk after the failed save: %+v %+v", st.History, st.Targets)
	}

	delete(w.actHook, "a")
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(5 * time.Second)
	rep := h.cycle(e)
	if got := executed(); len(got) != 1 {
		t.Fatalf("acted again after the disk freed: %v", got)
	}
	if d := decisionFor(rep, "process/1"); d.Outcome != OutcomeSkipped || d.Phase != PhaseVerifying {
		t.Fatalf("decision after the disk freed: %+v", d)
	}
	st, _ = (&Store{Dir: dir}).Load(h.clock.Now())
	ts := st.Targets["fix-it|process/1"]
	if st.History[0].Outcome != string(OutcomeExecuted) || ts.Phase != PhaseVerifying || !ts.LastActed.Equal(recs[len(recs)-1].Time) {
		t.Fatalf("state after recovery: %+v %+v, want executed and Verifying as the journal says", st.History, ts)
	}
	if len(rep.Warnings) == 0 || !strings.Contains(rep.Warnings[0], "taken from the journal") {
		t.Errorf("warnings %v", rep.Warnings)
	}
}
