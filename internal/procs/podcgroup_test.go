package procs

import (
	"strings"
	"testing"
)

const (
	testUID = "1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e"
	testCtr = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
)

func TestParsePodUID(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-abc.scope\n", testUID, true},
		{"12:memory:/kubepods/burstable/pod1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/0123abcd\n11:cpu:/kubepods/burstable/pod1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/0123abcd\n", testUID, true},
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

// TestParseCgroup: the drivers, cgroup versions and runtimes a kubelet
// names a container's cgroup with, a static pod's hash UID, the relative
// paths of a cgroup namespace, host processes, and what is ambiguous.
func TestParseCgroup(t *testing.T) {
	static := "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name, in string
		want     Cgroup
	}{
		{"systemd v2 containerd", "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-" + testCtr + ".scope\n",
			Cgroup{Place: CgroupPod, PodUID: testUID, ContainerID: testCtr}},
		{"systemd v2 crio guaranteed", "0::/kubepods.slice/kubepods-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/crio-" + testCtr + ".scope\n",
			Cgroup{Place: CgroupPod, PodUID: testUID, ContainerID: testCtr}},
		{"cgroupfs v1", "12:pids:/kubepods/besteffort/pod" + testUID + "/" + testCtr + "\n11:memory:/kubepods/besteffort/pod" + testUID + "/" + testCtr + "\n1:name=systemd:/kubepods/besteffort/pod" + testUID + "/" + testCtr + "\n0::/\n",
			Cgroup{Place: CgroupPod, PodUID: testUID, ContainerID: testCtr}},
		{"cgroupfs v2 unified", "0::/kubepods/pod" + testUID + "/" + testCtr + "\n",
			Cgroup{Place: CgroupPod, PodUID: testUID, ContainerID: testCtr}},
		{"static pod", "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + static + ".slice/cri-containerd-" + testCtr + ".scope\n",
			Cgroup{Place: CgroupPod, PodUID: static, ContainerID: testCtr}},
		{"cgroup namespace", "0::/../../kubepods-besteffort-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-" + testCtr + ".scope\n",
			Cgroup{Place: CgroupPod, PodUID: testUID, ContainerID: testCtr}},
		{"pod cgroup itself", "0::/kubepods/pod" + testUID + "\n", Cgroup{Place: CgroupPod, PodUID: testUID}},
		{"host systemd unit", "0::/system.slice/kubelet.service\n", Cgroup{Place: CgroupHost, Unit: "kubelet.service"}},
		{"host v1 hybrid unit", "12:pids:/system.slice/k3s.service\n1:name=systemd:/system.slice/k3s.service\n0::/system.slice/k3s.service\n", Cgroup{Place: CgroupHost, Unit: "k3s.service"}},
		{"host unit sub-cgroup", "0::/system.slice/kube-proxy.service/payload\n", Cgroup{Place: CgroupHost, Unit: "kube-proxy.service"}},
		{"host two units", "1:name=systemd:/system.slice/a.service\n0::/system.slice/b.service\n", Cgroup{Place: CgroupHost}},
		{"host unit on a controller line only", "4:memory:/system.slice/a.service\n0::/\n", Cgroup{Place: CgroupHost}},
		{"host v1 hybrid", "12:pids:/user.slice\n0::/user.slice/user-0.slice/session-3.scope\n", Cgroup{Place: CgroupHost}},
		{"two pods", "1:a:/kubepods/pod" + testUID + "/x\n2:b:/kubepods/pod2b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/x\n", Cgroup{Place: CgroupAmbiguous}},
		{"kubepods without pod", "0::/kubepods.slice/kubepods-burstable.slice\n", Cgroup{Place: CgroupAmbiguous}},
		{"pod-like name outside a segment", "0::/kubepods/xpod" + testUID + "y/z\n", Cgroup{Place: CgroupAmbiguous}},
		{"empty", "", Cgroup{Place: CgroupUnknown}},
	} {
		got := ParseCgroup([]byte(tc.in))
		got.Why = ""
		if got != tc.want {
			t.Errorf("%s: ParseCgroup = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func FuzzParsePodUID(f *testing.F) {
	f.Add([]byte("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-1.scope\n"))
	f.Add([]byte("12:memory:/kubepods/pod1b2c3d4e-0f1a-4b2c-8d3e-4f5a6b7c8d9e/x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		uid, ok := ParsePodUID(b)
		if ok != (uid != "") || (ok && len(uid) != 36 && len(uid) != 32) {
			t.Fatalf("%q -> %q %v", b, uid, ok)
		}
	})
}

func FuzzParseCgroup(f *testing.F) {
	f.Add([]byte("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c3d4e_0f1a_4b2c_8d3e_4f5a6b7c8d9e.slice/cri-containerd-" + testCtr + ".scope\n"))
	f.Add([]byte("12:pids:/kubepods/besteffort/pod" + testUID + "/" + testCtr + "\n0::/\n"))
	f.Add([]byte("0::/system.slice/containerd.service\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := ParseCgroup(b)
		switch c.Place {
		case CgroupPod:
			if len(c.PodUID) != 36 && len(c.PodUID) != 32 || strings.Contains(c.PodUID, "_") {
				t.Fatalf("%q -> bad uid %q", b, c.PodUID)
			}
			if c.ContainerID != "" && len(c.ContainerID) != 64 {
				t.Fatalf("%q -> bad container %q", b, c.ContainerID)
			}
		case CgroupHost, CgroupUnknown:
			if c.PodUID != "" || c.ContainerID != "" || c.Unit != "" && (!strings.HasSuffix(c.Unit, ".service") || strings.Contains(c.Unit, "/")) {
				t.Fatalf("%q -> %+v", b, c)
			}
		case CgroupAmbiguous:
			if c.Why == "" || c.PodUID != "" {
				t.Fatalf("%q -> %+v", b, c)
			}
		default:
			t.Fatalf("%q -> place %d", b, c.Place)
		}
	})
}
