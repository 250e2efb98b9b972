package realnode_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/remediate-dev/remediate/deploy"
)

// TestNodePodCost measures what the chart's pod costs at idle on the real
// node: CPU (millicores, from its pod cgroup's cpuacct.usage over the
// window) and RSS (memory.stat total_rss, sampled every 10 s: mean and
// max), against the chart's requests and limits and the requests of
// node-problem-detector (10m/80Mi) and the EKS node monitoring agent
// (10m/30Mi). Not part of the lane: `make pod-cost` runs it
// (REMEDIATE_NODE_POD_COST=<window>, default 10m).
func TestNodePodCost(t *testing.T) {
	window := os.Getenv("REMEDIATE_NODE_POD_COST")
	if window == "" {
		t.Skip("a measurement, not a test: make pod-cost")
	}
	d, err := time.ParseDuration(window)
	if err != nil {
		t.Fatalf("REMEDIATE_NODE_POD_COST=%q: %v", window, err)
	}
	n := needNode(t)
	ctx := context.Background()
	helm(t, n, append([]string{"install", "remediate", deploy.ChartDir(), "-n", releaseNS, "--create-namespace"}, chartValues(n)...)...)
	t.Cleanup(func() {
		bin, _ := deploy.HelmBin()
		_, _ = run(t, n, 3*time.Minute, bin, "uninstall", "remediate", "-n", releaseNS, "--wait")
	})
	waitRemediateReady(t, n)
	pods, err := n.Client.CoreV1().Pods(releaseNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=remediate"})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("pods: %v %d", err, len(pods.Items))
	}
	pod := pods.Items[0]
	// The pod's cgroup under the first of ctrls mounted: cpuacct is
	// co-mounted with cpu on most distributions (cpu,cpuacct) and mounted
	// alone on others (this machine).
	find := func(ctrls ...string) string {
		for _, ctrl := range ctrls {
			if _, err := os.Stat("/sys/fs/cgroup/" + ctrl); err != nil {
				continue
			}
			m, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/%s/kubepods/*/pod%s", ctrl, pod.UID))
			m2, _ := filepath.Glob(fmt.Sprintf("/sys/fs/cgroup/%s/kubepods/pod%s", ctrl, pod.UID))
			m = append(m, m2...)
			if len(m) != 1 {
				t.Fatalf("pod cgroup under %s: %v", ctrl, m)
			}
			return m[0]
		}
		t.Fatalf("none of the cgroup controllers %v is mounted under /sys/fs/cgroup", ctrls)
		return ""
	}
	cpuDir, memDir := find("cpu,cpuacct", "cpuacct"), find("memory")
	readInt := func(p, key string) int64 {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if key == "" && len(f) == 1 || len(f) == 2 && f[0] == key {
				v, err := strconv.ParseInt(f[len(f)-1], 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
		t.Fatalf("%s: no %q", p, key)
		return 0
	}
	// Let the first cycles pass (start-up costs are not idle cost).
	time.Sleep(time.Minute)
	cpu0, t0 := readInt(filepath.Join(cpuDir, "cpuacct.usage"), ""), time.Now()
	var rssSum, rssMax, samples int64
	for time.Since(t0) < d {
		rss := readInt(filepath.Join(memDir, "memory.stat"), "total_rss")
		rssSum += rss
		samples++
		rssMax = max(rssMax, rss)
		time.Sleep(10 * time.Second)
	}
	cpu1, el := readInt(filepath.Join(cpuDir, "cpuacct.usage"), ""), time.Since(t0)
	milli := float64(cpu1-cpu0) / float64(el.Nanoseconds()) * 1000
	load, _ := os.ReadFile("/proc/loadavg")
	cores := readCores()
	t.Logf("pod cost over %v (node %s, %d cores, load %s): CPU %.1fm; RSS mean %.1f MiB, max %.1f MiB",
		el.Round(time.Second), pod.Spec.NodeName, cores, strings.Join(strings.Fields(string(load))[:3], " "), milli,
		float64(rssSum/samples)/(1<<20), float64(rssMax)/(1<<20))
	c := pod.Spec.Containers[0].Resources
	t.Logf("chart: requests %s/%s, limits %s/%s; node-problem-detector requests 10m/80Mi; EKS node monitoring agent 10m/30Mi",
		c.Requests.Cpu(), c.Requests.Memory(), c.Limits.Cpu(), c.Limits.Memory())
}

func readCores() int {
	b, _ := os.ReadFile("/proc/cpuinfo")
	return strings.Count(string(b), "processor\t:")
}
