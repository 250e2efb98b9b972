package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"
)

// TestDetectorsHoldNoModel: a detector file reads as judgement only
// (thresholds, finding, evidence); the models it judges with live beside
// their adapters in internal/ (issue #29): the desired dataplane in
// internal/dataplane, which conntrack entries are stale in
// internal/conntrack/stale, which Service paths to probe in internal/probe
// (Plan). So no non-test file under detect/ walks the cluster view's
// Services and endpoints itself (View.Services, View.Endpoints,
// View.EndpointsChanged, cluster.UsableForCluster: kube-proxy's choice of
// endpoints), nor reads a conntrack entry's tuples (Flow.OrigSrc, OrigDst,
// ReplySrc, ReplyDst: classifying entries).
func TestDetectorsHoldNoModel(t *testing.T) {
	eachSource(t, []string{"detect"}, 30, nil, func(fset *token.FileSet, f *ast.File) {
		for _, r := range modelReads(f) {
			t.Errorf("%s: %s", fset.Position(r.Pos()), r.key)
		}
	})
}

// TestModelReadsFound: the check finds what it is for (the code of
// detect/conntrackstaleserviceentries.go and servicepathprobe.go before
// the move), and not a stale.Backend's ServiceNames or a Service's fields.
func TestModelReadsFound(t *testing.T) {
	const src = `package x
func f(v cluster.View, fl *conntrack.Flow, b *stale.Backend, s cluster.Service) {
	for _, s := range v.Services() {
		_ = v.Endpoints(s.Namespace, s.Name)
	}
	_ = n.Cluster.EndpointsChanged("ns", "a")
	_ = cluster.UsableForCluster(e, true)
	vip := fl.OrigDst.Addr()
	_ = fl.ReplySrc
	_ = b.ServiceNames()
	_ = s.Ports
}`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range modelReads(f) {
		got = append(got, strings.Fields(r.key)[0])
	}
	if want := "Services Endpoints EndpointsChanged cluster.UsableForCluster OrigDst ReplySrc"; strings.Join(got, " ") != want {
		t.Errorf("found %v, want %s", got, want)
	}
}

// modelReads finds the view walks and conntrack tuple reads of
// TestDetectorsHoldNoModel.
func modelReads(f *ast.File) []flagged {
	var out []flagged
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.CallExpr:
			sel, ok := x.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			name := sel.Sel.Name
			switch {
			case name == "Services" && len(x.Args) == 0,
				name == "Endpoints" && len(x.Args) == 2,
				name == "EndpointsChanged" && len(x.Args) == 2:
				out = append(out, flagged{x, name + " (a walk of the cluster view's Services and endpoints: the model belongs beside its adapter, e.g. internal/conntrack/stale, probe.Plan, dataplane.Desire)"})
			case exprName(sel) == "cluster.UsableForCluster":
				out = append(out, flagged{x, "cluster.UsableForCluster (choosing endpoints as kube-proxy does: plan in internal/probe or internal/dataplane)"})
			}
		case *ast.SelectorExpr:
			switch x.Sel.Name {
			case "OrigSrc", "OrigDst", "ReplySrc", "ReplyDst":
				out = append(out, flagged{x, x.Sel.Name + " (classifying conntrack entries: the staleness model is internal/conntrack/stale)"})
			}
		}
		return true
	})
	return out
}
