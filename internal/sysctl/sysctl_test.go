package sysctl

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestKeyPath(t *testing.T) {
	for _, tc := range []struct {
		key, want string
		err       bool
	}{
		{key: "net.netfilter.nf_conntrack_max", want: "net/netfilter/nf_conntrack_max"},
		{key: "net/netfilter/nf_conntrack_max", want: "net/netfilter/nf_conntrack_max"},
		// A slashed key keeps its dots (interface names such as eth0.100).
		{key: "net/ipv4/conf/eth0.100/rp_filter", want: "net/ipv4/conf/eth0.100/rp_filter"},
		{key: "", err: true},
		{key: "net..x", err: true},
		{key: "../etc/passwd", err: true},
		{key: "net/../../etc", err: true},
		{key: "/net/x", err: true},
	} {
		got, err := keyPath(tc.key)
		if (err != nil) != tc.err {
			t.Errorf("keyPath(%q) err = %v, want error %v", tc.key, err, tc.err)
			continue
		}
		if got != tc.want {
			t.Errorf("keyPath(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

func TestFSReadWriteTempRoot(t *testing.T) {
	root := t.TempDir()
	const key = "net.netfilter.nf_conntrack_max"
	if err := WriteFixture(root, key, "131072"); err != nil {
		t.Fatal(err)
	}
	s := New(root)
	n, err := GetUint(s, key)
	if err != nil || n != 131072 {
		t.Fatalf("GetUint = %d, %v; want 131072", n, err)
	}
	if err := SetUint(s, key, 262144); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "sys/net/netfilter/nf_conntrack_max"))
	if err != nil || string(b) != "262144\n" {
		t.Fatalf("file = %q, %v", b, err)
	}
	if n, _ := GetUint(s, key); n != 262144 {
		t.Fatalf("after Set GetUint = %d", n)
	}
}

func TestFSMissingAndGarbage(t *testing.T) {
	root := t.TempDir()
	s := New(root)
	if _, err := s.Get("net.netfilter.nf_conntrack_max"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing key: err = %v, want ErrNotExist", err)
	}
	// Set never creates a tunable that does not exist.
	if err := s.Set("net.netfilter.nf_conntrack_max", "1"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Set on missing key: err = %v, want ErrNotExist", err)
	}
	if err := WriteFixture(root, "net.netfilter.nf_conntrack_max", "lots"); err != nil {
		t.Fatal(err)
	}
	if _, err := GetUint(s, "net.netfilter.nf_conntrack_max"); err == nil {
		t.Fatal("GetUint of garbage: want error")
	}
}

// TestRealConntrackMaxOptIn writes the machine's real nf_conntrack_max (the
// same value back, then value+1, then the original) when
// REMEDIATE_TEST_REAL_SYSCTL=1. It proves the write path works against the
// real procfs; it is opt-in because it changes a machine-wide setting.
func TestRealConntrackMaxOptIn(t *testing.T) {
	if os.Getenv("REMEDIATE_TEST_REAL_SYSCTL") != "1" {
		t.Skip("set REMEDIATE_TEST_REAL_SYSCTL=1 to write the real nf_conntrack_max (restored afterwards)")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: writes /proc/sys/net/netfilter/nf_conntrack_max")
	}
	s := New("/proc")
	const key = "net.netfilter.nf_conntrack_max"
	orig, err := GetUint(s, key)
	if err != nil {
		t.Skipf("nf_conntrack not loaded: %v", err)
	}
	t.Cleanup(func() {
		if err := SetUint(s, key, orig); err != nil {
			t.Errorf("RESTORE FAILED: %s is not back to %d: %v", key, orig, err)
		}
	})
	if err := SetUint(s, key, orig+1); err != nil {
		t.Fatal(err)
	}
	if n, err := GetUint(s, key); err != nil || n != orig+1 {
		t.Fatalf("after write: %d, %v; want %d", n, err, orig+1)
	}
}
