package realnode_test

import (
	"bytes"
	"context"
	"fmt"
	"github.com/remediate-dev/remediate/internal/finding"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/cri"
	"github.com/remediate-dev/remediate/internal/kube"
	nodepkg "github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/realnode"
	"github.com/remediate-dev/remediate/policy"
)

// laterClock is the wall clock moved forward, so that the test's own
// fresh allocations are past HostLocalIPAM's leakGrace.
type laterClock struct{ by time.Duration }

func (c laterClock) Now() time.Time                  { return time.Now().Add(c.by) }
func (c laterClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// TestNodeHostLocalIPAMExhaustedAndLeaked: on the real node (kubelet,
// containerd, the bridge CNI with host-local over 10.244.0.0/24), the real
// host-local plugin is run by hand (CNI_COMMAND=ADD, the node's own ipam
// section) for container IDs containerd does not have until the range is
// exhausted. HostLocalIPAM, with the real containerd CRI socket, reports
// the range exhausted and those addresses leaked (the live sandboxes'
// addresses not); a pod created then fails with the kubelet's real
// FailedCreatePodSandBox Event, which PodsNetworkNotReady classifies as
// IPAMExhausted, correlated with HostLocalIPAM. The addresses are
// released (DEL) at the end, and a pod gets its sandbox again.
func TestNodeHostLocalIPAMExhaustedAndLeaked(t *testing.T) {
	n := needNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	conf, err := os.ReadFile(filepath.Join(n.CNIConfDir, "10-rn.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	// The plugin's own configuration, as libcni hands it to bridge (and
	// bridge to host-local): the network's name and the ipam section.
	ipam := conf[bytes.Index(conf, []byte(`"ipam"`)):]
	ipam = ipam[:bytes.Index(ipam, []byte(`}]}`))+3] // through the routes list
	plugin := fmt.Sprintf(`{"cniVersion":"0.4.0","name":"rn","type":"bridge",%s}`, ipam)
	hostLocal := filepath.Join(n.CNIBinDir, "host-local")
	exe := func(ctx context.Context, cmd, id string) (string, error) {
		c := exec.CommandContext(ctx, hostLocal)
		c.Env = []string{"CNI_COMMAND=" + cmd, "CNI_CONTAINERID=" + id, "CNI_NETNS=/proc/self/ns/net", "CNI_IFNAME=eth0", "CNI_PATH=" + n.CNIBinDir}
		c.Stdin = strings.NewReader(plugin)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	// The release (DEL of every address taken, then a pod's sandbox) has
	// a budget of its own: ~250 plugin runs each way on a loaded 2-core
	// machine can spend most of ctx's before it (seen: 217 DELs "context
	// deadline exceeded" at load 100, the range left exhausted).
	release := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), 5*time.Minute)
	}
	var ours []string
	defer func() {
		ctx, cancel := release()
		defer cancel()
		for _, id := range ours {
			if out, err := exe(ctx, "DEL", id); err != nil {
				t.Errorf("DEL %s: %v %s", id[:12], err, out)
			}
		}
	}()
	exhausted := ""
	for i := 0; i < 300; i++ {
		id := fmt.Sprintf("%064x", 0xdead0000+i)
		out, err := exe(ctx, "ADD", id)
		if err != nil {
			exhausted = out
			break
		}
		ours = append(ours, id)
	}
	if !strings.Contains(exhausted, "no IP addresses available in range set: 10.244.0.1-10.244.0.254") {
		t.Fatalf("after %d ADDs: %q", len(ours), exhausted)
	}
	t.Logf("host-local ADD x%d by hand, then: %s", len(ours), strings.TrimSpace(exhausted))

	sock := cri.New(n.ContainerdSock, 0)
	sbs, err := sock.ListPodSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nd := &nodepkg.Node{Name: realnode.NodeName, Clock: laterClock{10 * time.Minute}, CNIConfDir: n.CNIConfDir, CRI: sock}
	ty, _ := detect.Lookup("HostLocalIPAM")
	p := ty.NewParams()
	d, err := ty.New(p, nd)
	if err != nil {
		t.Fatal(err)
	}
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 2 {
		t.Fatalf("%+v %v", fs, err)
	}
	if fs[0].Target != "cni-ipam/rn" || fs[0].Severity != finding.Critical || !strings.Contains(fs[0].Message, "253 of 253 addresses of 10.244.0.1-10.244.0.254") {
		t.Errorf("usage finding %+v", fs[0])
	}
	// Leaked: exactly ours; the live sandboxes' addresses are not.
	if fs[1].Target != "cni-ipam/rn/leaked" || fs[1].Evidence["leaked"] != len(ours) {
		t.Errorf("leaked %v of %d ours (runtime has %d sandboxes): %s", fs[1].Evidence["leaked"], len(ours), len(sbs), fs[1].Message)
	}
	t.Logf("%s; %s (%d sandboxes in containerd)", fs[0].Message, fs[1].Message[:min(200, len(fs[1].Message))], len(sbs))

	// A pod now: the kubelet's real FailedCreatePodSandBox, classified.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ipam-starved", Namespace: "default"},
		Spec: corev1.PodSpec{NodeName: realnode.NodeName, TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{Name: "c", Image: realnode.BusyboxImage, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}}}}
	if _, err := n.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer n.Client.CoreV1().Pods("default").Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	pw, err := kube.NewPodWatch(n.Client, realnode.NodeName, nil, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	pw.Start(wctx)
	if !pw.WaitForSync(ctx) {
		t.Fatal("pod watch not synced")
	}
	nd.Pods, nd.PodEvents, nd.Clock = pw, kube.NewSandboxEvents(n.Client, realnode.NodeName, 0), clock.RealClock{}
	pt, _ := detect.Lookup("PodsNetworkNotReady")
	pp := pt.NewParams()
	pp.(*detect.PodsNetworkNotReadyParams).MinAge = policy.D(time.Second)
	pd, err := pt.New(pp, nd)
	if err != nil {
		t.Fatal(err)
	}
	var last string
	err = n.Poll(ctx, "PodsNetworkNotReady classifying the real kubelet event", 2*time.Minute, func(ctx context.Context) (bool, string) {
		fs, err := pd.Detect(ctx)
		if err != nil || len(fs) != 1 {
			return false, fmt.Sprintf("%+v %v", fs, err)
		}
		sf, ok := fs[0].Evidence["sandboxFailures"].(map[string]any)
		last = fs[0].Message
		return ok && sf["topKind"] == "IPAMExhausted" && sf["correlatesWith"] == "HostLocalIPAM", fmt.Sprint(fs[0].Evidence["sandboxFailures"])
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("PodsNetworkNotReady: %s", last)
	// Released: the pod gets its sandbox.
	ctx, cancel = release()
	defer cancel()
	for _, id := range ours {
		if out, err := exe(ctx, "DEL", id); err != nil {
			t.Errorf("DEL %s: %v %s", id[:12], err, out)
		}
	}
	ours = nil
	err = n.Poll(ctx, "the pod's sandbox after the release", 2*time.Minute, func(ctx context.Context) (bool, string) {
		p, err := n.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprint(p.Status.Conditions)
	})
	if err != nil {
		t.Error(err)
	}
}
