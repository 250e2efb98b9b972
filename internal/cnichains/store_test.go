package cnichains

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestFileStoreRoundTrip: what Save wrote, a new FileStore (a restarted
// daemon) loads; no temporary file is left.
func TestFileStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a, _ := Lookup("aws-vpc-cni")
	seen, _ := Remember(Seen{}, Observe(capture(t, a.Name), a), time.Date(2026, 11, 25, 20, 0, 0, 0, time.UTC), 0)
	var m Memory
	m.Set(a.Name, "IPv4/legacy", seen)
	if err := (&FileStore{Dir: dir}).Save(m); err != nil {
		t.Fatal(err)
	}
	got, err := (&FileStore{Dir: dir}).Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got.Get(a.Name, "IPv4/legacy"), seen) || got.Version != 1 {
		t.Fatalf("loaded %+v, want %+v", got, seen)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != File {
		t.Errorf("state dir holds %v", ents)
	}
	// An empty Seen is deleted, not kept as an empty entry.
	m.Set(a.Name, "IPv4/legacy", Seen{})
	if len(m.Agents) != 0 {
		t.Errorf("empty memory kept: %+v", m.Agents)
	}
}

// TestFileStoreHostile: a missing file is an empty memory; a FIFO, a
// symlink, an oversized or a corrupt file is an error (never a hang, never
// followed, never read whole), and the next Save replaces it.
func TestFileStoreHostile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, p string)
	}{
		{"fifo", func(t *testing.T, p string) {
			if err := syscall.Mkfifo(p, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"symlink", func(t *testing.T, p string) {
			target := filepath.Join(t.TempDir(), "elsewhere.json")
			if err := os.WriteFile(target, []byte(`{"version":1}`), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
		}},
		{"oversized", func(t *testing.T, p string) {
			if err := os.WriteFile(p, []byte(`{"agents":{"x":"`+strings.Repeat("a", maxFile)+`"}}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"corrupt", func(t *testing.T, p string) {
			if err := os.WriteFile(p, []byte(`{"agents":[`), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.plant(t, filepath.Join(dir, File))
			s := &FileStore{Dir: dir}
			done := make(chan error, 1)
			go func() { _, err := s.Load(); done <- err }()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("no error")
				}
				t.Logf("%s: %v", tc.name, err)
			case <-time.After(20 * time.Second):
				t.Fatal("Load hung")
			}
			if err := s.Save(Memory{}); err != nil {
				t.Fatal(err)
			}
			if m, err := s.Load(); err != nil || len(m.Agents) != 0 {
				t.Fatalf("after Save: %+v, %v", m, err)
			}
		})
	}
	if m, err := (&FileStore{Dir: t.TempDir()}).Load(); err != nil || m.Version != 1 || len(m.Agents) != 0 {
		t.Fatalf("missing file: %+v, %v", m, err)
	}
}

// FuzzMemory: any state file either fails to load or loads into a memory
// that Check and Remember handle without panicking.
func FuzzMemory(f *testing.F) {
	f.Add([]byte(`{"version":1,"agents":{"flannel":{"IPv4/legacy":{"chains":{"nat/FLANNEL-POSTRTG":{"rules":7,"lastSeen":"2026-11-25T20:00:00Z"}},"hooks":{"nat/POSTROUTING->FLANNEL-POSTRTG":{"hook":{"table":"nat","from":"POSTROUTING","to":"FLANNEL-POSTRTG"},"lastSeen":"2026-11-25T20:00:00Z"}}}}}}`))
	f.Add([]byte(`{"agents":{"calico":{"x":{"chains":{"":{}, "/":{"rules":-1}}}}}}`))
	rs := capture(f, "flannel")
	a, _ := Lookup("flannel")
	o := Observe(rs, a)
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, File), b, 0o600); err != nil {
			t.Fatal(err)
		}
		m, err := (&FileStore{Dir: dir}).Load()
		if err != nil {
			return
		}
		for name, keys := range m.Agents {
			for k, s := range keys {
				_ = Check(o, a, s)
				s2, _ := Remember(s, o, time.Now(), time.Hour)
				m.Set(name, k, s2)
			}
		}
	})
}
