package procs

import "testing"

func TestParsePodUID(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-abc.scope\n", "1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e", true},
		{"12:memory:/kubepods/burstable/pod1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/0123abcd\n11:cpu:/kubepods/burstable/pod1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/0123abcd\n", "1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e", true},
		{"0::/system.slice/containerd.service\n", "", false},
		{"0::/user.slice/user-0.slice/session-1.scope\n", "", false},
		{"1:a:/kubepods/pod1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/x\n2:b:/kubepods/pod2b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/x\n", "", false},
		{"garbage", "", false},
	} {
		got, ok := ParsePodUID([]byte(tc.in))
		if got != tc.want || ok != tc.ok {
			t.Errorf("ParsePodUID(%q) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParsePodUID(f *testing.F) {
	f.Add([]byte("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-1.scope\n"))
	f.Add([]byte("12:memory:/kubepods/pod1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		uid, ok := ParsePodUID(b)
		if ok != (uid != "") || (ok && len(uid) != 36) {
			t.Fatalf("%q -> %q %v", b, uid, ok)
		}
	})
}
