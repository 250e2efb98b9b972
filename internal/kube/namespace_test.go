package kube

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestNamespace: $POD_NAMESPACE first, else the service account's
// namespace file as the kubelet mounts it (a trailing newline trimmed),
// else kube-system; an invalid value, a missing file, a FIFO and an
// oversized file are passed over. Without the file's reading (main) a
// daemon outside the chart used kube-system whatever its namespace.
func TestNamespace(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	sa := write("namespace", "remediate-system")
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, env, file string
		want            string
		from            NamespaceSource
	}{
		{"env first", "remediate", sa, "remediate", NamespaceFromEnv},
		{"service account file", "", sa, "remediate-system", NamespaceFromServiceAccount},
		{"trailing newline", "", write("nl", "ops\n"), "ops", NamespaceFromServiceAccount},
		{"invalid env, file", "Not_A_Name", sa, "remediate-system", NamespaceFromServiceAccount},
		{"no file", "", filepath.Join(dir, "missing"), "kube-system", NamespaceDefault},
		{"no path", "", "", "kube-system", NamespaceDefault},
		{"invalid file", "", write("bad", "../etc"), "kube-system", NamespaceDefault},
		{"empty file", "", write("empty", ""), "kube-system", NamespaceDefault},
		{"fifo", "", fifo, "kube-system", NamespaceDefault},
		{"huge", "", write("huge", string(make([]byte, 4096))), "kube-system", NamespaceDefault},
		{"directory", "", dir, "kube-system", NamespaceDefault},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, from := Namespace(tc.env, tc.file)
			if got != tc.want || from != tc.from {
				t.Fatalf("Namespace(%q, %q) = %q from %s, want %q from %s", tc.env, tc.file, got, from, tc.want, tc.from)
			}
		})
	}
}

// FuzzNamespace: whatever the service account file holds, Namespace
// answers a valid namespace name (the file's, trimmed) or kube-system.
func FuzzNamespace(f *testing.F) {
	for _, s := range []string{"remediate", "ops\n", "", "../etc", "Not_A_Name", " kube-system ", "a\x00b"} {
		f.Add(s)
	}
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, content string) {
		p := filepath.Join(dir, "namespace")
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		ns, from := Namespace("", p)
		switch from {
		case NamespaceFromServiceAccount:
			if !validNamespace(ns) || len(content) > 256 {
				t.Fatalf("%q from the file %q", ns, content)
			}
		case NamespaceDefault:
			if ns != "kube-system" {
				t.Fatalf("default %q", ns)
			}
		default:
			t.Fatalf("source %s without env", from)
		}
	})
}
