package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/utils/ptr"

	"github.com/remediate-dev/remediate/internal/kube"
	"github.com/remediate-dev/remediate/remediate/exporters/fleetview"
	"github.com/remediate-dev/remediate/remediate/exporters/kubeexporter"
	"github.com/remediate-dev/remediate/remediate/guardrails"
)

// assertTerminalSafe fails when out holds a byte or rune a terminal acts
// on: C0 controls but newline and tab, DEL, C1, bidi controls.
func assertTerminalSafe(t *testing.T, out string) {
	t.Helper()
	for i := 0; i < len(out); i++ {
		if c := out[i]; c == 0x7f || c < 0x20 && c != '\n' && c != '\t' {
			t.Errorf("byte 0x%02x at %d reaches the terminal:\n%q", c, i, out)
			return
		}
	}
	for _, r := range out {
		if r >= 0x80 && r < 0xa0 || r >= 0x202a && r <= 0x202e || r >= 0x2066 && r <= 0x2069 {
			t.Errorf("rune %U reaches the terminal:\n%q", r, out)
			return
		}
	}
}

// A node's token can write its own condition message, its Lease's
// holder and annotations, Events about it and the pause ConfigMap's
// reason (if it may): the fleet view shows them escaped, one line each.
// On main the escape sequences were printed raw (screen cleared, a fake
// "all good" line, the rest concealed).
func TestFleetViewNeutralisesEscapes(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	const clear = "\x1b[2J\x1b[H"
	hostileMsg := clear + "Fleet pause: none\nNodes: 3 all True\x1b[8m; hidden rest"
	mt := metav1.NewMicroTime(now.Add(-time.Minute))
	in := fleetview.Inputs{
		Nodes: []corev1.Node{{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
			Type: kubeexporter.DefaultConditionType, Status: corev1.ConditionFalse, Reason: "R", Message: hostileMsg,
			LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))}}}}},
		Leases: []coordv1.Lease{{ObjectMeta: metav1.ObjectMeta{Name: "remediate-budget-0",
			Labels: map[string]string{guardrails.LabelLease: guardrails.LeaseBudget},
			Annotations: map[string]string{guardrails.AnnotationRule: "rule\r\x1b]0;pwned\x07", guardrails.AnnotationTarget: "admin\u202egnp.exe",
				guardrails.AnnotationAction: "\u009b2JRestart"}},
			Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("node-1\x1b[2K\rnobody"), RenewTime: &mt, AcquireTime: &mt, LeaseDurationSeconds: ptr.To(int32(300))}}},
		Events: []eventsv1.Event{{ObjectMeta: metav1.ObjectMeta{Name: "e"}, Reason: kubeexporter.ReasonExecuted, ReportingController: "remediate.dev/remediate",
			Action: "CordonNode\x1b[8m", EventTime: mt, Regarding: corev1.ObjectReference{Kind: "Node", Name: "node-1"}}},
		Pause: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "remediate-fleet"}, Data: map[string]string{kube.PauseKey: "paused\x1b[2J\n\u2066"}},
	}
	f := fleetview.Build(in, now, fleetview.Options{})
	var b bytes.Buffer
	printFleet(&b, &f, now)
	out := b.String()
	assertTerminalSafe(t, out)
	for _, want := range []string{`\x1b[2J\x1b[H`, `\u202e`, `\u009b`, `\r`, `\u2066`} {
		if !strings.Contains(out, want) {
			t.Errorf("%s not shown escaped:\n%s", want, out)
		}
	}
	// No forged line: the message's newline stays inside its row.
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "Nodes: 3 all True") || strings.HasPrefix(l, "Fleet pause: none") {
			t.Errorf("forged line %q:\n%s", l, out)
		}
	}

	// -o json: the same view as JSON is safe to print and decodes to the
	// same strings.
	var j bytes.Buffer
	if err := encodeFleetJSON(&j, &f); err != nil {
		t.Fatal(err)
	}
	assertTerminalSafe(t, j.String())
	var back fleetview.Fleet
	if err := json.Unmarshal(j.Bytes(), &back); err != nil || back.Nodes[0].Message != hostileMsg {
		t.Errorf("JSON does not decode to the message (%v): %q", err, back.Nodes[0].Message)
	}
}

// escExec is an executor whose pod prints escape sequences, cut in the
// middle of a rune, on stdout and stderr.
type escExec struct{}

func (escExec) Exec(_ context.Context, _ *corev1.Pod, _ string, _ []string, stdout, stderr io.Writer) error {
	msg := []byte("FINDINGS: \x1b[2J\x1b[Hall good — \u202eevil\u009b\n")
	for i := range msg {
		stdout.Write(msg[i : i+1])
	}
	fmt.Fprint(stderr, "warn \x1b]0;title\x07\n")
	return utilexec.CodeExitError{Err: errors.New("command terminated with exit code 2"), Code: 2}
}

// `kubectl remediate NODE` passes the pod's output on neutralised (a
// compromised node prints what it likes), its exit status intact. On main
// the bytes went to the terminal as sent.
func TestRemoteOutputNeutralised(t *testing.T) {
	var out, errb bytes.Buffer
	err := execToTerminal(context.Background(), escExec{}, &corev1.Pod{}, "c", []string{"remediate"}, &out, &errb)
	if code, _ := exitCode(err); code != 2 {
		t.Errorf("exit %d (%v), want 2", code, err)
	}
	assertTerminalSafe(t, out.String())
	assertTerminalSafe(t, errb.String())
	if out.String() != `FINDINGS: \u001b[2J\u001b[Hall good — \u202eevil\u009b`+"\n" {
		t.Errorf("stdout %q", out.String())
	}
}
