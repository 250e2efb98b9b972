package deploy

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// psaLevels are the Pod Security Admission labels remediate's namespace
// carries: its pod needs hostNetwork, hostPID and hostPath, which the
// baseline and restricted levels refuse.
var psaLevels = []string{"pod-security.kubernetes.io/enforce", "pod-security.kubernetes.io/audit", "pod-security.kubernetes.io/warn"}

func chartAppVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(ChartDir(), "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindSubmatch(b)
	if m == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	return string(m[1])
}

// Both kustomize overlays: the namespace is labelled privileged for Pod
// Security Admission (else the DaemonSet is accepted and its pod refused
// under a baseline default), and every image is pinned to the chart's
// appVersion, never :latest (the chart refuses latest).
func TestKustomizePSAAndPinnedImage(t *testing.T) {
	want := chartAppVersion(t)
	for _, overlay := range []string{"audit", "enforce"} {
		t.Run(overlay, func(t *testing.T) {
			m, err := Render(overlay)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := KustomizeObjects(m)
			if err != nil {
				t.Fatal(err)
			}
			var images []string
			nsSeen := false
			for _, o := range objs {
				if o.GetKind() == "Namespace" {
					nsSeen = true
					for _, l := range psaLevels {
						if got := o.GetLabels()[l]; got != "privileged" {
							t.Errorf("Namespace %s: label %s=%q, want privileged", o.GetName(), l, got)
						}
					}
				}
				for _, path := range [][]string{{"spec", "template", "spec", "containers"}, {"spec", "template", "spec", "initContainers"}} {
					cs, _, _ := unstructured.NestedSlice(o.Object, path...)
					for _, c := range cs {
						img, _ := c.(map[string]any)["image"].(string)
						images = append(images, img)
					}
				}
			}
			if !nsSeen {
				t.Error("no Namespace rendered")
			}
			if len(images) == 0 {
				t.Fatal("no container images rendered")
			}
			for _, img := range images {
				if strings.HasSuffix(img, ":latest") || !strings.Contains(img, ":") || !strings.HasSuffix(img, ":"+want) {
					t.Errorf("image %q: want pinned to %s (Chart.yaml appVersion), never latest", img, want)
				}
			}
		})
	}
}

// Every repository file the chart's values.yaml and README name exists
// (values.yaml named deploy/alerts/remediate-alerts.yaml, which never did).
func TestChartNamesExistingFiles(t *testing.T) {
	root := filepath.Join(Dir(), "..")
	re := regexp.MustCompile(`\b((?:deploy|examples|tools|cmd|internal)/[A-Za-z0-9_./-]*[A-Za-z0-9_])`)
	for _, f := range []string{filepath.Join(ChartDir(), "values.yaml"), filepath.Join(Dir(), "README.md")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllString(string(b), -1) {
			if _, err := os.Stat(filepath.Join(root, m)); err != nil {
				t.Errorf("%s names %s: %v", filepath.Base(f), m, err)
			}
		}
	}
}

// helm template --set image.tag=latest is refused with the reason (the
// schema's "not" said only "'not' failed").
func TestChartLatestTagMessage(t *testing.T) {
	helm := needHelm(t)
	_, err := RenderChart(context.Background(), helm, "ops", "--set", "image.tag=latest")
	if err == nil || !strings.Contains(err.Error(), `image.tag: "latest" is refused; pin a version`) || strings.Contains(err.Error(), "'not' failed") {
		t.Errorf("helm template --set image.tag=latest: %v", err)
	}
}
