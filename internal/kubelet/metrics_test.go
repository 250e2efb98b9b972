package kubelet

import (
	"bytes"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// TestParseMetricsBounded: a body over MaxBody is refused, not truncated
// into a wrong figure.
func TestParseMetricsBounded(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("# TYPE kubelet_run_podsandbox_errors_total counter\nkubelet_run_podsandbox_errors_total{runtime_handler=\"\"} 3\n")
	for b.Len() <= MaxBody {
		b.WriteString("# a comment line that only takes room in the body of this test\n")
	}
	if _, err := ParseMetrics(&b); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("oversized body: %v", err)
	}
}

// FuzzParseMetrics: any body parses or fails cleanly (expfmt's panics
// become errors); sums are never negative.
func FuzzParseMetrics(f *testing.F) {
	if b, err := os.ReadFile("testdata/kubelet-metrics-v1.34.4.txt"); err == nil {
		f.Add(b)
	}
	f.Add([]byte("# TYPE kubelet_run_podsandbox_errors_total counter\nkubelet_run_podsandbox_errors_total{runtime_handler=\"\"} -3\n"))
	f.Add([]byte("# TYPE kubelet_pod_start_sli_duration_seconds histogram\nkubelet_pod_start_sli_duration_seconds_bucket{le=\"60\"} 1\nkubelet_pod_start_sli_duration_seconds_bucket{le=\"+Inf\"} 2\nkubelet_pod_start_sli_duration_seconds_sum 70\nkubelet_pod_start_sli_duration_seconds_count 2\n"))
	f.Add([]byte("# HELP x\n{"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseMetrics(bytes.NewReader(b))
		if err != nil {
			return
		}
		// Parsing only the families read gives what parsing all of it
		// gives, whenever all of it parses.
		if fams, err := kubeproxy.ParseText(bytes.NewReader(b)); err == nil {
			if full := metricsOf(fams); !reflect.DeepEqual(m, full) {
				t.Fatalf("filtered parse %+v, full parse %+v", m, full)
			}
		}
		if m.SandboxErrors != nil && *m.SandboxErrors < 0 {
			t.Fatalf("negative error count %v", *m.SandboxErrors)
		}
		if m.PodStartSLI != nil {
			m.PodStartSLI.Quantile(0.99)
		}
	})
}

// TestParseMetricsRealCapture reads the real kubelet v1.34.4's /metrics
// captured on the real-node lane (TestNodeKubeletMetricsRBAC, see
// testdata/README.md): one sandbox run; no sandbox error yet and no pod
// start SLI observation yet, so those two series are absent (a labelled
// vector with no child is not exposed), which the parser reports as nil,
// not as zero.
func TestParseMetricsRealCapture(t *testing.T) {
	f, err := os.Open("testdata/kubelet-metrics-v1.34.4.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, err := ParseMetrics(f)
	if err != nil {
		t.Fatal(err)
	}
	if m.SandboxDuration == nil || m.SandboxDuration.Count != 1 || len(m.SandboxDuration.Buckets) == 0 {
		t.Fatalf("sandbox duration %+v", m.SandboxDuration)
	}
	if v, inf, ok := m.SandboxDuration.Quantile(0.99); !ok || inf || v > 0.005 {
		t.Errorf("sandbox p99 = %v (inf %v, ok %v), want within the first bucket (0.005 s)", v, inf, ok)
	}
	if m.SandboxErrors != nil || m.PodStartSLI != nil {
		t.Errorf("absent series parsed as present: errors %v, SLI %+v", m.SandboxErrors, m.PodStartSLI)
	}
}

// TestFamilyLinesParseAsTheWhole: on the real capture, and on a body
// where the families read come between others (labels, a histogram, a
// counter with no HELP), parsing only their lines gives what parsing the
// whole body gives; a body with no # HELP or # TYPE line (an HTML page) is
// a bad answer, as the whole parse made it.
func TestFamilyLinesParseAsTheWhole(t *testing.T) {
	real, err := os.ReadFile("testdata/kubelet-metrics-v1.34.4.txt")
	if err != nil {
		t.Fatal(err)
	}
	mixed := []byte(`# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42
# TYPE kubelet_run_podsandbox_errors_total counter
kubelet_run_podsandbox_errors_total{runtime_handler=""} 3
kubelet_run_podsandbox_errors_total{runtime_handler="kata"} 2
# TYPE kubelet_run_podsandbox_errors_total_other counter
kubelet_run_podsandbox_errors_total_other 7
# HELP kubelet_pod_start_sli_duration_seconds Pod start.
# TYPE kubelet_pod_start_sli_duration_seconds histogram
kubelet_pod_start_sli_duration_seconds_bucket{le="5"} 1
kubelet_pod_start_sli_duration_seconds_bucket{le="60"} 2
kubelet_pod_start_sli_duration_seconds_bucket{le="+Inf"} 4
kubelet_pod_start_sli_duration_seconds_sum 190
kubelet_pod_start_sli_duration_seconds_count 4
# TYPE rest_client_requests_total counter
rest_client_requests_total{code="200"} 9
`)
	for name, b := range map[string][]byte{"real capture": real, "mixed": mixed} {
		got, err := ParseMetrics(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		fams, err := kubeproxy.ParseText(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if want := metricsOf(fams); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: filtered %+v, whole %+v", name, got, want)
		}
	}
	if m, _ := ParseMetrics(bytes.NewReader(mixed)); m.SandboxErrors == nil || *m.SandboxErrors != 5 || m.PodStartSLI == nil || m.PodStartSLI.Count != 4 {
		t.Errorf("mixed: %+v", m)
	}
	if _, err := ParseMetrics(strings.NewReader("<html><body>502 Bad Gateway</body></html>\n")); err == nil {
		t.Error("an HTML page parsed as metrics")
	}
}

// BenchmarkParseMetrics parses the real kubelet v1.34.4 capture (~200 kB,
// of which three families are read): what KubeletPodStartup pays a cycle.
func BenchmarkParseMetrics(b *testing.B) {
	in, err := os.ReadFile("testdata/kubelet-metrics-v1.34.4.txt")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(in)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if _, err := parseMetrics(in); err != nil {
			b.Fatal(err)
		}
	}
}
