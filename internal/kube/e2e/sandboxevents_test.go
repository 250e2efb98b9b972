package e2e

import (
	"context"
	"fmt"
	"github.com/remediate-dev/remediate/internal/finding"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/testing/clusterload"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
	"github.com/remediate-dev/remediate/internal/testing/deploytest"
	"github.com/remediate-dev/remediate/internal/testing/fakekubelet"
	"github.com/remediate-dev/remediate/policy"
)

// The sandbox failure texts, as the kubelet v1.34.4 formats them
// (kuberuntime_manager.go "Failed to create pod sandbox: %v"; kubelet.go
// "error killing pod: %v") around containerd's and the plugins' errors
// (internal/cni/testdata/sandbox_failures.txt cites the sources).
const (
	e2eIPAM   = `Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox "5d1b0b4f0a9e8c2a3f7b6d5e4c3b2a1908f7e6d5c4b3a29180f7e6d5c4b3a291": plugin type="bridge" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.0.2-10.244.0.3`
	e2eKill   = `error killing pod: failed to "KillPodSandbox" for "9ed4c1f2" with KillPodSandboxError: "rpc error: code = Unknown desc = failed to destroy network for sandbox \"6fd3061e3b44\": plugin type=\"calico\" failed (delete): stat /var/lib/calico/nodename: no such file or directory: check that the calico/node container is running and has mounted /var/lib/calico/"`
	e2eDL     = `Failed to create pod sandbox: rpc error: code = DeadlineExceeded desc = context deadline exceeded`
	e2ePlugin = `Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox "6a02": plugin type="bridge" failed (add): failed to find plugin "bridge" in path [/opt/cni/bin]`
)

// kubeletRecorder is the kubelet's own Event recorder (client-go
// tools/record, as cmd/kubelet/app/server.go builds it: source component
// "kubelet", host the node's name) writing core/v1 Events to the real
// apiserver; its correlator folds repeats into one Event's count.
func kubeletRecorder(t *testing.T, cp *controlplane.ControlPlane, nodeName string) record.EventRecorder {
	b := record.NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cp.Client.CoreV1().Events("")})
	t.Cleanup(b.Shutdown)
	return b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: nodeName})
}

// TestSandboxEventsEndToEnd: on a real kube-apiserver, the kubelet's
// recorder writes FailedCreatePodSandBox and FailedKillPod Events for pods
// of n1 (repeats folded into counts) and of n2; PodsNetworkNotReady, as
// the daemon's ServiceAccount on n1 with the audit overlay's RBAC, reads
// them with one field-selected LIST per stuck pod and reports IPAM
// exhausted as the top kind with its count, the message and HostLocalIPAM;
// n2's Events are never counted. The requests are recorded (the cost).
func TestSandboxEventsEndToEnd(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	for _, n := range []string{"n1", "n2"} {
		mkNode(t, cp.Client, n)
	}
	const ns = "sandbox-e2e"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	deploytest.ApplyOverlay(t, cp, "audit", false)

	long := time.Now().Add(-time.Hour)
	a := fakekubelet.Create(t, cp.Client, fakekubelet.Workload(ns, "stuck-a", "n1"), fakekubelet.SandboxNotReady(long))
	b := fakekubelet.Create(t, cp.Client, fakekubelet.Workload(ns, "stuck-b", "n1"), fakekubelet.SandboxNotReady(long))
	o := fakekubelet.Create(t, cp.Client, fakekubelet.Workload(ns, "other", "n2"), fakekubelet.SandboxNotReady(long))
	r1, r2 := kubeletRecorder(t, cp, "n1"), kubeletRecorder(t, cp, "n2")
	emit := func(r record.EventRecorder, p *corev1.Pod, reason, msg string, times int) {
		for i := 0; i < times; i++ {
			r.Event(p, corev1.EventTypeWarning, reason, msg)
		}
	}
	emit(r1, a, cluster.ReasonFailedCreatePodSandBox, e2eIPAM, 3)
	emit(r1, b, cluster.ReasonFailedCreatePodSandBox, e2eIPAM, 2)
	emit(r1, b, cluster.ReasonFailedCreatePodSandBox, e2eDL, 1)
	emit(r1, b, cluster.ReasonFailedKillPod, e2eKill, 1)
	emit(r1, a, "Scheduled", "not a sandbox event", 1)
	emit(r2, o, cluster.ReasonFailedCreatePodSandBox, e2ePlugin, 9)

	// The Events as stored: the kubelet's shape, repeats folded.
	waitFor(t, 30*time.Second, "the recorder's events stored", func() (bool, string) {
		l, err := cp.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: kube.SandboxEventsSelector(string(a.UID))})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range l.Items {
			if e.Reason == cluster.ReasonFailedCreatePodSandBox && e.Count == 3 {
				if e.Source.Host != "n1" || e.ReportingInstance != "n1" || e.ReportingController != "kubelet" || e.InvolvedObject.Kind != "Pod" || e.InvolvedObject.APIVersion != "v1" {
					t.Fatalf("event shape %+v", e)
				}
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(l.Items))
	})

	var mu sync.Mutex
	var lists []string
	c, err := kube.NewClient(deploytest.AsDaemon(cp, "n1"), kube.Options{QPS: 50, Burst: 100,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return rtFunc(func(req *http.Request) (*http.Response, error) {
				if strings.HasSuffix(req.URL.Path, "/events") {
					mu.Lock()
					lists = append(lists, req.Method+" "+req.URL.RequestURI())
					mu.Unlock()
				}
				return rt.RoundTrip(req)
			})
		}})
	if err != nil {
		t.Fatal(err)
	}
	pw := syncedPodWatch(ctx, t, c, "n1")
	// Every Detect reads afresh (the answers kept per pod are
	// TestSandboxEventsKeptPerPod's): the loop below waits for the
	// recorder's last Events.
	events := kube.NewSandboxEvents(c.Interface, "n1", 0)
	events.TTL = 0
	n := &node.Node{Name: "n1", Clock: clock.RealClock{}, Pods: pw, PodEvents: events}
	ty, _ := detect.Lookup("PodsNetworkNotReady")
	p := ty.NewParams()
	if errs := p.(policy.Validator).Validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	d, err := ty.New(p, n)
	if err != nil {
		t.Fatal(err)
	}
	var sf map[string]any
	var f finding.Finding
	waitFor(t, 30*time.Second, "the classified sandbox failures", func() (bool, string) {
		mu.Lock()
		lists = nil
		mu.Unlock()
		fs, err := d.Detect(ctx)
		if err != nil || len(fs) != 1 {
			return false, fmt.Sprintf("%+v %v", fs, err)
		}
		f = fs[0]
		var ok bool
		sf, ok = f.Evidence["sandboxFailures"].(map[string]any)
		return ok && sf["count"] == 5 && sf["kinds"].(map[string]int)["AgentUnreachable"] == 1, fmt.Sprint(f.Evidence["sandboxFailures"])
	})
	if sf["topKind"] != "IPAMExhausted" || sf["correlatesWith"] != "HostLocalIPAM" || sf["podsRead"] != 2 || sf["podsWithEvents"] != 2 ||
		sf["kinds"].(map[string]int)["Unknown"] != 1 || sf["kinds"].(map[string]int)["PluginMissing"] != 0 {
		t.Errorf("evidence %v", sf)
	}
	if m := sf["message"].(string); !strings.HasPrefix(m, `failed to setup network for sandbox "5d1b0b4f0a9e": plugin type="bridge"`) || !strings.Contains(m, "no IP addresses available in range set: 10.244.0.2-10.244.0.3") {
		t.Errorf("message %q", m)
	}
	if !strings.Contains(f.Message, "sandbox failures: IPAMExhausted x5 in the events of 2 pods (see HostLocalIPAM)") {
		t.Errorf("finding message %q", f.Message)
	}
	// The cost: one LIST per stuck pod, field-selected to its UID, limited.
	mu.Lock()
	defer mu.Unlock()
	if len(lists) != 2 {
		t.Fatalf("requests %v", lists)
	}
	for _, l := range lists {
		if !strings.HasPrefix(l, "GET /api/v1/namespaces/"+ns+"/events?") || !strings.Contains(l, "involvedObject.uid") || !strings.Contains(l, "limit=100") ||
			!strings.Contains(l, "resourceVersion=0") {
			t.Errorf("request %s", l)
		}
	}
	t.Logf("requests of one Detect: %v", lists)
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestSandboxEventsKeptPerPod: the fleet-scale herd of the sandbox Event
// LIST. On a real kube-apiserver with an audit log (every request
// counted per user), two pods of n1 stuck for an hour with the kubelet's
// FailedCreatePodSandBox Events; PodsNetworkNotReady, as the daemon's
// ServiceAccount on n1, runs 5 times (5 cycles) with the daemon's
// SandboxEvents. The audit log counts 2 Event LISTs of n1's daemon (one
// per stuck pod; before the answers were kept per pod UID: 10, one per pod
// per cycle), and every Detect still reports both pods' failures.
func TestSandboxEventsKeptPerPod(t *testing.T) {
	args, auditLog := clusterload.AuditArgs(t)
	cp := controlplane.Start(t, controlplane.Options{ExtraAPIServerArgs: args})
	ctx := context.Background()
	mkNode(t, cp.Client, "n1")
	const ns = "sandbox-kept"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deploytest.ApplyOverlay(t, cp, "audit", false)
	long := time.Now().Add(-time.Hour)
	r := kubeletRecorder(t, cp, "n1")
	for _, name := range []string{"stuck-a", "stuck-b"} {
		p := fakekubelet.Create(t, cp.Client, fakekubelet.Workload(ns, name, "n1"), fakekubelet.SandboxNotReady(long))
		for i := 0; i < 2; i++ {
			r.Event(p, corev1.EventTypeWarning, cluster.ReasonFailedCreatePodSandBox, e2eIPAM)
		}
		waitFor(t, 30*time.Second, "the events of "+name+" stored", func() (bool, string) {
			l, err := cp.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: kube.SandboxEventsSelector(string(p.UID))})
			if err != nil {
				return false, err.Error()
			}
			return len(l.Items) == 1 && l.Items[0].Count == 2, fmt.Sprintf("%d events", len(l.Items))
		})
	}

	c, err := kube.NewClient(deploytest.AsDaemon(cp, "n1"), kube.Options{QPS: 50, Burst: 100})
	if err != nil {
		t.Fatal(err)
	}
	pw := syncedPodWatch(ctx, t, c, "n1")
	n := &node.Node{Name: "n1", Clock: clock.RealClock{}, Pods: pw, PodEvents: kube.NewSandboxEvents(c.Interface, "n1", 0)}
	ty, _ := detect.Lookup("PodsNetworkNotReady")
	d, err := ty.New(ty.NewParams(), n)
	if err != nil {
		t.Fatal(err)
	}
	tally := clusterload.NewAuditTally(nil)
	count := func() int {
		time.Sleep(time.Second) // the audit log's last lines
		if err := tally.ReadFile(auditLog); err != nil {
			t.Fatal(err)
		}
		return tally.Requests[clusterload.Who{Node: "n1", Role: "daemon"}][clusterload.Key{Verb: "list", Resource: "events"}]
	}
	if got := count(); got != 0 {
		t.Fatalf("%d Event LISTs before the first cycle", got)
	}
	for cycle := 1; cycle <= 5; cycle++ {
		fs, err := d.Detect(ctx)
		if err != nil || len(fs) != 1 {
			t.Fatalf("cycle %d: %+v %v", cycle, fs, err)
		}
		sf, ok := fs[0].Evidence["sandboxFailures"].(map[string]any)
		if !ok || sf["topKind"] != "IPAMExhausted" || sf["count"] != 4 || sf["podsRead"] != 2 || sf["podsWithEvents"] != 2 {
			t.Fatalf("cycle %d: evidence %v", cycle, fs[0].Evidence["sandboxFailures"])
		}
	}
	if got := count(); got != 2 {
		t.Fatalf("5 cycles with 2 stuck pods made %d Event LISTs as n1's daemon (audit log), want 2: one per stuck pod per 5 minutes", got)
	}
}

// syncedPodWatch starts the pod watch of node through c (as the daemon
// does), synced within 20 s, stopped at the test's end.
func syncedPodWatch(ctx context.Context, t *testing.T, c *kube.Client, node string) *kube.PodWatch {
	t.Helper()
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	pw, err := kube.NewPodWatch(c.Interface, node, c.Contact, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	pw.Start(wctx)
	sctx, scancel := context.WithTimeout(ctx, 20*time.Second)
	defer scancel()
	if !pw.WaitForSync(sctx) {
		t.Fatalf("pod watch not synced: %+v", pw.Freshness())
	}
	return pw
}
