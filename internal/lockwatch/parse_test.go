package lockwatch

import (
	"slices"
	"testing"
)

func TestParseCgroup(t *testing.T) {
	for _, c := range []struct{ in, uid, ctr string }{
		{"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_4000_8000_0123456789ab.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n",
			"1b2c3d4e-0000-4000-8000-0123456789ab", "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{"12:pids:/kubepods/besteffort/pod1b2c3d4e-0000-4000-8000-0123456789ab/abcdef0123456789abcdef\n11:cpu,cpuacct:/kubepods/besteffort/pod1b2c3d4e-0000-4000-8000-0123456789ab/abcdef0123456789abcdef\n",
			"1b2c3d4e-0000-4000-8000-0123456789ab", "abcdef0123456789abcdef"},
		{"0::/kubepods.slice/kubepods-pod1b2c3d4e_0000_4000_8000_0123456789ab.slice\n", "1b2c3d4e-0000-4000-8000-0123456789ab", ""},
		{"0::/system.slice/containerd.service\n", "", ""},
		{"0::/kubepods/podnot-a-uid/abc\n", "", ""},
		{"garbage", "", ""},
	} {
		uid, ctr := ParseCgroup([]byte(c.in))
		if uid != c.uid || ctr != c.ctr {
			t.Errorf("ParseCgroup(%q) = %q, %q; want %q, %q", c.in, uid, ctr, c.uid, c.ctr)
		}
	}
}

func TestLocksOf(t *testing.T) {
	in := "1: FLOCK  ADVISORY  WRITE 6721 fe:00:9773057 0 EOF\n" +
		"1: -> FLOCK  ADVISORY  WRITE 6922 fe:00:9773057 0 EOF\n" +
		"1:  -> FLOCK  ADVISORY  WRITE 6923 fe:00:9773057 0 EOF\n" +
		"2: POSIX  ADVISORY  WRITE 10 fe:00:977305 0 EOF\n" +
		"3: FLOCK  ADVISORY  WRITE 11 00:1a:5 0 EOF"
	h, w, err := LocksOf([]byte(in), "fe:00:9773057")
	if err != nil || !slices.Equal(h, []int32{6721}) || !slices.Equal(w, []int32{6922, 6923}) {
		t.Fatalf("LocksOf = %v %v %v", h, w, err)
	}
	if _, _, err := LocksOf([]byte("x: fe:00:9773057 y\n"), "fe:00:9773057"); err == nil {
		t.Error("malformed line of the lock file accepted")
	}
}

func FuzzParseCgroup(f *testing.F) {
	f.Add([]byte("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0000_4000_8000_0123456789ab.slice/cri-containerd-0123456789abcdef.scope\n"))
	f.Add([]byte("11:cpu:/kubepods/pod1b2c3d4e-0000-4000-8000-0123456789ab/abcdef0123456789\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		uid, ctr := ParseCgroup(b)
		if uid != "" && !isUID(uid) || len(ctr) > 128 {
			t.Fatalf("ParseCgroup = %q, %q", uid, ctr)
		}
	})
}

func FuzzLocksOf(f *testing.F) {
	f.Add([]byte("1: FLOCK  ADVISORY  WRITE 6721 fe:00:9773057 0 EOF\n1: -> FLOCK  ADVISORY  WRITE 6922 fe:00:9773057 0 EOF\n"), "fe:00:9773057")
	f.Fuzz(func(t *testing.T, b []byte, key string) {
		h, w, err := LocksOf(b, key)
		if err == nil && len(h)+len(w) > len(b) {
			t.Fatalf("more locks than bytes")
		}
	})
}
