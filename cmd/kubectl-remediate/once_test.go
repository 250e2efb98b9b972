package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// gateExec answers remediate --once per node (exit codes by node name, a
// JSON report with -o json), counts the runs in flight, and holds every
// run until `gate` of them have started (so the bound is reached, with no
// sleep); a node in block runs until its context ends.
type gateExec struct {
	mu       sync.Mutex
	cond     *sync.Cond
	gate     int
	started  int
	inflight int
	maxSeen  int
	codes    map[string]int
	block    map[string]bool
	ran      []string
}

func newGateExec(gate int, codes map[string]int) *gateExec {
	g := &gateExec{gate: gate, codes: codes, block: map[string]bool{}}
	g.cond = sync.NewCond(&g.mu)
	return g
}

func (g *gateExec) Exec(ctx context.Context, pod *corev1.Pod, _ string, cmd []string, stdout, _ io.Writer) error {
	node := pod.Spec.NodeName
	g.mu.Lock()
	g.started++
	g.inflight++
	g.maxSeen = max(g.maxSeen, g.inflight)
	g.ran = append(g.ran, node)
	g.cond.Broadcast()
	for g.started < g.gate {
		g.cond.Wait()
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inflight--
		g.mu.Unlock()
	}()
	if g.block[node] {
		<-ctx.Done()
		return ctx.Err()
	}
	if slices.Contains(cmd, "json") {
		fmt.Fprintf(stdout, "{\"node\":%q,\"findings\":[]}\n", node)
	} else {
		fmt.Fprintf(stdout, "FINDINGS on %s\n", node)
	}
	if c := g.codes[node]; c != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", c), Code: c}
	}
	return nil
}

// `kubectl remediate once` on many nodes against a real kube-apiserver:
// the pods found by label across pages, --all-nodes, -l on Nodes, named
// nodes; at most --parallel in flight (and that many reached); one merged
// report with each node's exit status and report; the plugin's exit is
// the worst (error > findings > none); a node with no running pod, a node
// that outlives --node-timeout and nodes not started by --timeout are
// errors in the report, not a hang. A fake executor stands in for the
// kubelets.
func TestOnceManyAgainstAPIServer(t *testing.T) {
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	const ns = "remediate"
	if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lbl := map[string]string{"app.kubernetes.io/name": "remediate"}
	for i := 1; i <= 8; i++ {
		node := fmt.Sprintf("om%d", i)
		role := map[bool]string{true: "x", false: "y"}[i == 1 || i == 2 || i == 8]
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{"role": role}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		switch {
		case i <= 6:
			createPod(t, cp.Client, ns, daemonPod("remediate-"+node, node, lbl), corev1.PodRunning)
		case i == 7:
			createPod(t, cp.Client, ns, daemonPod("remediate-"+node, node, lbl), corev1.PodPending)
		}
	}
	codes := map[string]int{"om2": 2, "om5": 2}
	plugin := func(t *testing.T, fe Executor, args ...string) (int, string, string) {
		t.Helper()
		d := deps{restConfig: func(string, string) (*rest.Config, error) { return cp.RestConfig, nil },
			newExecutor: func(*rest.Config, kubernetes.Interface) Executor { return fe }}
		var out, errb bytes.Buffer
		code := run(ctx, args, &out, &errb, d)
		return code, out.String(), errb.String()
	}

	t.Run("all-nodes", func(t *testing.T) {
		fe := newGateExec(3, codes)
		code, out, errs := plugin(t, fe, "once", "--all-nodes", "--parallel", "3", "-o", "json")
		if code != 1 {
			t.Errorf("exit %d, want 1 (om7 has no running pod): %s", code, errs)
		}
		var m mergedReport
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if fe.maxSeen != 3 {
			t.Errorf("at most %d in flight, want 3 (--parallel 3)", fe.maxSeen)
		}
		got := map[string]nodeResult{}
		for _, r := range m.Nodes {
			got[r.Node] = r
		}
		if len(m.Nodes) != 7 || m.Exit != 1 || m.Counts[0] != 4 || m.Counts[2] != 2 || m.Counts[1] != 1 {
			t.Errorf("merged: exit %d counts %v, %d nodes", m.Exit, m.Counts, len(m.Nodes))
		}
		for n, want := range map[string]int{"om1": 0, "om2": 2, "om3": 0, "om4": 0, "om5": 2, "om6": 0, "om7": 1} {
			r := got[n]
			if r.Exit != want {
				t.Errorf("%s: exit %d, want %d (%s)", n, r.Exit, want, r.Error)
			}
			var rep struct{ Node string }
			if want != 1 && (json.Unmarshal(r.Report, &rep) != nil || rep.Node != n) {
				t.Errorf("%s: report %q", n, r.Report)
			}
		}
		if !strings.Contains(got["om7"].Error, "no running remediate pod on node om7") || slices.Contains(fe.ran, "om7") {
			t.Errorf("om7: %+v (ran %v)", got["om7"], fe.ran)
		}
	})

	t.Run("node-selector", func(t *testing.T) {
		fe := newGateExec(1, codes)
		code, out, _ := plugin(t, fe, "once", "-l", "role=x")
		if code != 1 || !strings.Contains(out, "no remediate pod on node om8") || !strings.Contains(out, "=== node om2 (pod remediate/remediate-om2): exit 2") ||
			!strings.Contains(out, "3 node(s): 1 no findings, 1 findings, 1 errors or not run; exit 1") {
			t.Errorf("exit %d:\n%s", code, out)
		}
	})

	t.Run("worst-is-findings", func(t *testing.T) {
		code, out, _ := plugin(t, newGateExec(1, codes), "once", "om1", "om2", "om3")
		if code != 2 {
			t.Errorf("exit %d, want 2:\n%s", code, out)
		}
		if code, out, _ := plugin(t, newGateExec(1, codes), "once", "om1", "om3"); code != 0 {
			t.Errorf("exit %d, want 0:\n%s", code, out)
		}
	})

	t.Run("timeouts", func(t *testing.T) {
		fe := newGateExec(1, codes)
		fe.block["om4"] = true
		// om4 outlives --node-timeout; om1 still runs.
		code, out, _ := plugin(t, fe, "once", "om4", "om1", "--parallel", "1", "--node-timeout", "1s")
		if code != 1 || !strings.Contains(out, "om4") || !strings.Contains(out, "deadline exceeded") || !strings.Contains(out, "=== node om1 (pod remediate/remediate-om1): exit 0") {
			t.Errorf("--node-timeout: exit %d:\n%s", code, out)
		}
		// om4 outlives --timeout: om6, queued behind it, is not run.
		fe = newGateExec(1, codes)
		fe.block["om4"] = true
		code, out, _ = plugin(t, fe, "once", "om4", "om6", "--parallel", "1", "--timeout", "2s", "-o", "json")
		var m mergedReport
		if err := json.Unmarshal([]byte(out), &m); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if code != 1 || len(m.Nodes) != 2 || m.Nodes[0].Exit != 1 || m.Nodes[1].Exit != 1 || !strings.HasPrefix(m.Nodes[1].Error, "not run:") || slices.Contains(fe.ran, "om6") {
			t.Errorf("--timeout: exit %d %+v (ran %v)", code, m.Nodes, fe.ran)
		}
	})

	t.Run("usage", func(t *testing.T) {
		for _, args := range [][]string{{"once"}, {"once", "om1", "--all-nodes"}, {"once", "--all-nodes", "--parallel", "0"}} {
			if code, _, errs := plugin(t, newGateExec(1, nil), args...); code != 1 || !strings.Contains(errs, "Error:") {
				t.Errorf("%v: exit %d %s", args, code, errs)
			}
		}
	})
}

// worse and merge: error > findings > none, whatever the order; an exit
// status other than 0 and 2 (a killed remediate) counts as an error.
func TestMergeWorst(t *testing.T) {
	for _, c := range []struct {
		exits []int
		want  int
	}{
		{nil, 0}, {[]int{0, 0}, 0}, {[]int{0, 2, 0}, 2}, {[]int{2, 1}, 1}, {[]int{1, 2}, 1}, {[]int{0, 137}, 1}, {[]int{137, 2}, 1},
	} {
		var rs []nodeResult
		for i, e := range c.exits {
			rs = append(rs, nodeResult{Node: fmt.Sprint(i), Exit: e})
		}
		if m := merge(rs); m.Exit != c.want {
			t.Errorf("%v: worst %d, want %d", c.exits, m.Exit, c.want)
		}
	}
}
