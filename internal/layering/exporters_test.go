package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"strconv"
	"strings"
	"testing"
)

// metricsHome is the one package that defines, registers and serves
// Prometheus metrics (issue 29: one home per concern).
const metricsHome = "remediate/exporters/prometheusexporter/"

// TestPrometheusOnlyInTheExporter: no package but metricsHome imports
// Prometheus's client library (prometheus, promauto, collectors,
// promhttp): a metric defined, registered or served anywhere else is a
// second home for metrics. Reading another program's metrics
// (client_model, expfmt: internal/kubeproxy, internal/kubelet) is not
// exporting and stays allowed.
func TestPrometheusOnlyInTheExporter(t *testing.T) {
	home := func(path string) bool { return strings.Contains(path, "/"+metricsHome) }
	eachSource(t, []string{"cmd", "detect", "internal", "policy", "remediate"}, 200, home, func(fset *token.FileSet, f *ast.File) {
		for _, n := range promClientImports(f) {
			t.Errorf("%s: %s: metrics are defined, registered and served in %s only (the engine hands it each report: remediate.Exporter)",
				fset.Position(n.Pos()), n.key, strings.TrimSuffix(metricsHome, "/"))
		}
	})
}

// TestPromClientImportsFound: the check finds what it is for (a planted
// registration outside the exporter) and lets metric parsing be.
func TestPromClientImportsFound(t *testing.T) {
	const src = `package x
import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)
var g = prometheus.NewGauge(prometheus.GaugeOpts{Name: "remediate_planted"})
func init() { prometheus.MustRegister(g) }`
	f, err := parser.ParseFile(token.NewFileSet(), "x.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(promClientImports(f)); got != 3 {
		t.Errorf("found %d, want 3 (prometheus, promauto, promhttp; not client_model, expfmt)", got)
	}
}

// promClientImports are f's imports of Prometheus's client library.
func promClientImports(f *ast.File) []flagged {
	var out []flagged
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if p == "github.com/prometheus/client_golang/prometheus" || strings.HasPrefix(p, "github.com/prometheus/client_golang/prometheus/") {
			out = append(out, flagged{imp, "imports " + p})
		}
	}
	return out
}
