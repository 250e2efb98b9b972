package clusterload

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/testing/fakekubelet"
)

// stuckNS holds the pods the fleet leaves without a sandbox.
const stuckNS = "fleet-stuck"

// addStuckPods creates k pods on node whose sandbox has failed for an
// hour (PodsNetworkNotReady's stuck pods), each with the kubelet's
// FailedCreatePodSandBox Event, so that every node's daemon reads sandbox
// Events (the per-pod Event LIST).
func addStuckPods(tb testing.TB, f *Fleet, node string, k int) {
	tb.Helper()
	ctx := context.Background()
	if _, err := f.Admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: stuckNS}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	if _, err := f.Admin.CoreV1().ServiceAccounts(stuckNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
	long := time.Now().Add(-time.Hour)
	for j := 0; j < k; j++ {
		p := fakekubelet.Create(tb, f.Admin, fakekubelet.Workload(stuckNS, fmt.Sprintf("stuck-%s-%d", node, j), node), fakekubelet.SandboxNotReady(long))
		now := metav1.Now()
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: p.Name + ".sandbox", Namespace: stuckNS},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: stuckNS, Name: p.Name, UID: p.UID},
			Reason:         cluster.ReasonFailedCreatePodSandBox, Type: corev1.EventTypeWarning, Count: 3,
			Message: `Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup network for sandbox "5d1b": plugin type="bridge" failed (add): failed to allocate for range 0: no IP addresses available in range set: 10.244.0.2-10.244.0.3`,
			Source:  corev1.EventSource{Component: "kubelet", Host: node}, FirstTimestamp: now, LastTimestamp: now,
		}
		if _, err := f.Admin.CoreV1().Events(stuckNS).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
}

// remediateBinary is $REMEDIATE_BENCH_BIN, else the daemon built into a
// temporary folder.
func remediateBinary(tb testing.TB) string {
	tb.Helper()
	if b := os.Getenv("REMEDIATE_BENCH_BIN"); b != "" {
		abs, _ := filepath.Abs(b)
		return abs
	}
	bin := filepath.Join(tb.TempDir(), "remediate")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/remediate-dev/remediate/cmd/remediate")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build cmd/remediate: %v\n%s", err, out)
	}
	return bin
}

// TestFleetHarness keeps `make bench-fleet`'s harness from rotting: the
// real apiserver with its audit log, 20 Services, two nodes (each its
// namespace, the real kube-proxy and the daemon at a 5 s interval), two
// stuck pods with sandbox Events per node. It asserts the audit parsing
// (every node's daemon and kube-proxy counted under their own source
// address: their initial LISTs and their watches, open at the end) and the
// rule that neither lists anything after its initial sync: 0 LISTs in
// two cycles of steady state, the stuck pods' Events included. Nothing is
// timed.
func TestFleetHarness(t *testing.T) {
	const interval = 5 * time.Second
	bin := remediateBinary(t)
	f := StartFleet(t, bin, policyFile(t, interval), 30*time.Second)
	ctx := context.Background()
	if err := Populate(ctx, f.Admin, 0, 20, 2, 2, 4); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	for i := 0; i < 2; i++ {
		addStuckPods(t, f, NodeName(i), 2)
		f.AddNode(i)
	}
	f.WaitNodes(since, 2, 3*time.Minute)
	a := f.Sample()
	if f.Tally.Events == 0 || f.Tally.Bad != 0 {
		t.Fatalf("audit log: %d events, %d lines not parsed", f.Tally.Events, f.Tally.Bad)
	}
	for _, n := range f.Nodes {
		for _, role := range []string{"daemon", "kube-proxy"} {
			w := Who{n.Name, role}
			lists, watches := 0, 0
			for k, v := range a.Requests[w] {
				switch k.Verb {
				case "list":
					lists += v
				case "watch":
					watches += v
				}
			}
			if lists == 0 || watches == 0 || a.Open[w] == 0 {
				t.Errorf("%s %s: %d LISTs and %d watches counted, %d open (requests %v)", n.Name, role, lists, watches, a.Open[w], a.Requests[w])
			}
			if a.TxBytes[w] == 0 {
				t.Errorf("%s %s: no bytes counted on its link", n.Name, role)
			}
		}
	}
	// Two cycles of each daemon, counted on its metrics.
	c0 := map[string]int{}
	for _, n := range f.Nodes {
		c0[n.Name], _ = n.DaemonCycles()
	}
	deadline := time.Now().Add(2 * time.Minute)
	for _, n := range f.Nodes {
		for {
			if c, _ := n.DaemonCycles(); c >= c0[n.Name]+2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: its daemon did not complete 2 more cycles", n.Name)
			}
			time.Sleep(time.Second)
		}
	}
	b := f.Sample()
	for _, role := range []string{"daemon", "kube-proxy"} {
		p := f.Cost(a, b, role)
		t.Log(p)
		if p.ListTotal() != 0 {
			d := Delta(a.Requests, b.Requests)
			for _, n := range f.Nodes {
				t.Errorf("%s %s LISTed after its initial sync: %s", n.Name, role, FormatKeys(d[Who{n.Name, role}], 1))
			}
		}
	}
}

// BenchmarkFleet is `make bench-fleet` (root, -benchtime 1x; figures in
// docs/SCALE.md): the fleet's control plane with FLEET_SERVICES Services
// (default 5,000) of 5 endpoints spread over the nodes, populated once,
// then nodes added in steps (FLEET_NODES, default 10,25,50), each with the
// real kube-proxy and the released daemon (REMEDIATE_BENCH_BIN) running
// examples/audit.yaml as it is (30 s interval, jitter) and FLEET_STUCK
// (default 2) stuck pods with sandbox Events. At each step, after every
// node synced: FLEET_PHASE (default 3m) steady, then as long under
// FLEET_CHURN (default 20) changes a minute; per role the requests a
// minute per node by verb and resource, the LISTs, the open watches, the
// bytes sent, CPU, and the Lease writes of the whole fleet.
func BenchmarkFleet(b *testing.B) {
	if os.Getenv("REMEDIATE_BENCH_BIN") == "" {
		b.Skip("REMEDIATE_BENCH_BIN (the binary to measure) is not set: run `make bench-fleet`")
	}
	bin := remediateBinary(b)
	var sizes []int
	for _, s := range strings.Split(envOr("FLEET_NODES", "10,25,50"), ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil {
			b.Fatalf("FLEET_NODES: %v", err)
		}
		sizes = append(sizes, n)
	}
	services := envInt("FLEET_SERVICES", 5000)
	phase := envDuration("FLEET_PHASE", 3*time.Minute)
	churn := envInt("FLEET_CHURN", 20)
	stuck := envInt("FLEET_STUCK", 2)
	const eps = 5
	maxN := sizes[len(sizes)-1]

	pol := filepath.Join(b.TempDir(), "policy.yaml")
	_, file, _, _ := runtime.Caller(0)
	audit, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "examples", "audit.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(pol, audit, 0o644); err != nil {
		b.Fatal(err)
	}
	f := StartFleet(b, bin, pol, 30*time.Second)
	ctx := context.Background()
	fmt.Printf("machine: %d cores, %s; %d Services x %d endpoints over %d node names; phases of %v; churn %d a minute; load average at start %s\n",
		runtime.NumCPU(), kernel(), services, eps, maxN, phase, churn, LoadAvg())
	t0 := time.Now()
	if err := Populate(ctx, f.Admin, 0, services, eps, maxN, 8); err != nil {
		b.Fatal(err)
	}
	fmt.Printf("%d Services created in %v (load average %s)\n", services, time.Since(t0).Round(time.Second), LoadAvg())
	var rows []string
	for _, n := range sizes {
		since := time.Now()
		for i := len(f.Nodes); i < n; i++ {
			addStuckPods(b, f, NodeName(i), stuck)
			f.AddNode(i)
		}
		f.WaitNodes(since, 2, 20*time.Minute)
		fmt.Printf("%d nodes synced in %v (load average %s)\n", n, time.Since(since).Round(time.Second), LoadAvg())
		for _, ph := range []string{"steady", "churn"} {
			cctx, stop := context.WithCancel(ctx)
			done := make(chan string, 1)
			if ph == "churn" {
				go func() {
					c, r, d, err := Churn(cctx, f.Admin, churn, 1_000_000+n, services, eps, maxN)
					s := fmt.Sprintf("%d created, %d rescaled, %d deleted", c, r, d)
					if err != nil {
						s += fmt.Sprintf(" (%v)", err)
					}
					done <- s
				}()
			} else {
				close(done)
			}
			a := f.Sample()
			apiA, _, _ := CPU(f.CP.APIServer().Pid())
			time.Sleep(phase)
			z := f.Sample()
			apiZ, _, _ := CPU(f.CP.APIServer().Pid())
			stop()
			churned := <-done
			for _, role := range []string{"daemon", "kube-proxy"} {
				p := f.Cost(a, z, role)
				row := fmt.Sprintf("| %d | %s | %s |", n, ph, p)
				fmt.Println(row)
				rows = append(rows, row)
			}
			other := Delta(a.Requests, z.Requests)[Who{Role: "other"}]
			fmt.Printf("  apiserver CPU %.0f ms/min, RSS %.0f MiB; load average %s; others' requests: %s; %s\n",
				(apiZ-apiA)/z.At.Sub(a.At).Minutes(), StatusMiB(f.CP.APIServer().Pid(), "VmRSS:"), LoadAvg(),
				FormatKeys(other, 1/z.At.Sub(a.At).Minutes()), churned)
		}
	}
	fmt.Println()
	for _, r := range rows {
		fmt.Println(r)
	}
}
