package remediate

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// TestDeprecatedActionLoggedAtLoad: a rule that still says RestartKubeProxy
// loads and runs as RestartNodeAgent, and every load (start and reload)
// says so in the log; a rule naming RestartNodeAgent logs nothing.
func TestDeprecatedActionLoggedAtLoad(t *testing.T) {
	h := newHarness(t)
	core, logs := observer.New(zapcore.WarnLevel)
	h.opts.Log = zap.New(core)
	src := strings.Replace(enforceRule, "{type: FakeFix, key: a}", "{type: RestartKubeProxy, namespace: kube-system, labelSelector: k8s-app=kube-proxy}", 1)
	e := h.engine(mustPolicy(t, src))
	if err := e.SetPolicy(mustPolicy(t, src)); err != nil {
		t.Fatal(err)
	}
	got := logs.FilterMessageSnippet("deprecated action type").All()
	if len(got) != 2 || got[0].ContextMap()["rule"] != "fix-it" || got[0].ContextMap()["action"] != "RestartKubeProxy" ||
		!strings.Contains(got[0].Message, "runs as RestartNodeAgent") || !strings.Contains(got[0].ContextMap()["note"].(string), "write {type: RestartNodeAgent}") {
		t.Fatalf("load and reload of a RestartKubeProxy rule logged %+v", got)
	}
	if err := e.SetPolicy(mustPolicy(t, strings.Replace(src, "type: RestartKubeProxy, namespace: kube-system, labelSelector: k8s-app=kube-proxy", "type: RestartNodeAgent", 1))); err != nil {
		t.Fatal(err)
	}
	if n := logs.FilterMessageSnippet("deprecated").Len(); n != 2 {
		t.Fatalf("RestartNodeAgent logged a deprecation: %d lines", n)
	}
}
