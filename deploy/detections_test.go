package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// detections returns a policy's detections: each rule's detector as one
// line (its type and every parameter after defaults, in the catalog's
// field order), mapped to the names of the rules that carry it. What a
// rule does with a finding (for, action, cooldown, ...) is not part of it.
func detections(t *testing.T, name string, data []byte) map[string][]string {
	t.Helper()
	p, err := policy.Parse(name, data, remediate.Catalog{})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	out := map[string][]string{}
	for _, r := range p.Rules {
		b, err := yaml.Marshal(r.Detector)
		if err != nil {
			t.Fatalf("%s: rule %s: %v", name, r.Name, err)
		}
		var m yaml.Node
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		// One line, flow style, so a difference reads as one line.
		setFlow(&m)
		line, err := yaml.Marshal(&m)
		if err != nil {
			t.Fatal(err)
		}
		k := strings.TrimSpace(string(line))
		out[k] = append(out[k], r.Name)
	}
	return out
}

func setFlow(n *yaml.Node) {
	n.Style |= yaml.FlowStyle
	for _, c := range n.Content {
		setFlow(c)
	}
}

// diffDetections names every detection one policy has and the other has
// not (the same detector type with other parameters is two lines).
func diffDetections(audit, enforce map[string][]string) []string {
	var d []string
	for k, rules := range audit {
		if _, ok := enforce[k]; !ok {
			d = append(d, fmt.Sprintf("only in audit (rules %s): %s", strings.Join(rules, ", "), k))
		}
	}
	for k, rules := range enforce {
		if _, ok := audit[k]; !ok {
			d = append(d, fmt.Sprintf("only in enforce (rules %s): %s", strings.Join(rules, ", "), k))
		}
	}
	slices.Sort(d)
	return d
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestEnforceKeepsAuditDetections: enforce is audit's detections plus
// actions. Every detector (type and parameters) the audit policy runs, the
// enforce policy runs too, and the reverse, in the examples, in the chart's
// copies, in what the chart renders (enforce=false/true) and in what the
// kustomize overlays render. Turning enforce on must never switch a
// detection off or make it blunter: what differs is only what a rule does
// with a finding (for, action, cooldown, rate limit, attempts, dryRun).
func TestEnforceKeepsAuditDetections(t *testing.T) {
	check := func(t *testing.T, audit, enforce map[string][]string) {
		t.Helper()
		if len(audit) == 0 || len(enforce) == 0 {
			t.Fatalf("no detections: audit %d, enforce %d", len(audit), len(enforce))
		}
		for _, d := range diffDetections(audit, enforce) {
			t.Error(d)
		}
	}
	t.Run("examples", func(t *testing.T) {
		ex := filepath.Join(Dir(), "..", "examples")
		check(t, detections(t, "examples/audit.yaml", readFile(t, filepath.Join(ex, "audit.yaml"))),
			detections(t, "examples/enforce.yaml", readFile(t, filepath.Join(ex, "enforce.yaml"))))
	})
	t.Run("chart-files", func(t *testing.T) {
		f := filepath.Join(ChartDir(), "files")
		check(t, detections(t, "chart audit.yaml", readFile(t, filepath.Join(f, "audit.yaml"))),
			detections(t, "chart enforce.yaml", readFile(t, filepath.Join(f, "enforce.yaml"))))
	})
	t.Run("kustomize-overlays", func(t *testing.T) {
		pol := map[string][]byte{}
		for _, overlay := range []string{"audit", "enforce"} {
			m, err := Render(overlay)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, r := range m.Resources() {
				if r.GetKind() != "ConfigMap" {
					continue
				}
				js, err := r.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				var cm corev1.ConfigMap
				if err := sigsyaml.Unmarshal(js, &cm); err != nil {
					t.Fatal(err)
				}
				if p, ok := cm.Data["policy.yaml"]; ok {
					pol[overlay] = []byte(p)
					n++
				}
			}
			if n != 1 {
				t.Fatalf("overlay %s: %d policy ConfigMaps, want 1", overlay, n)
			}
		}
		check(t, detections(t, "overlay audit", pol["audit"]), detections(t, "overlay enforce", pol["enforce"]))
	})
	t.Run("chart-rendered", func(t *testing.T) {
		helm := needHelm(t)
		pol := map[string][]byte{}
		for mode, set := range map[string][]string{"audit": nil, "enforce": {"--set", "enforce=true"}} {
			objs, err := RenderChart(context.Background(), helm, ChartNamespace, set...)
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if o.GetKind() != "ConfigMap" {
					continue
				}
				if p, ok, _ := unstructuredString(o.Object, "data", "policy.yaml"); ok {
					if pol[mode] != nil {
						t.Fatalf("chart %s: two policy ConfigMaps", mode)
					}
					pol[mode] = []byte(p)
				}
			}
			if pol[mode] == nil {
				t.Fatalf("chart %s: no policy ConfigMap", mode)
			}
		}
		check(t, detections(t, "chart audit", pol["audit"]), detections(t, "chart enforce=true", pol["enforce"]))
	})
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	var cur any = obj
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur, ok = m[f]
		if !ok {
			return "", false, nil
		}
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// TestDiffDetections: the comparison itself sees a missing detector and a
// changed parameter, and nothing in identical policies.
func TestDiffDetections(t *testing.T) {
	const head = "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nrules:\n"
	a := detections(t, "a", []byte(head+"- name: x\n  detector: {type: KubeProxySyncStale, factor: 1}\n- name: y\n  detector: {type: KubeProxyUnhealthy}\n"))
	if d := diffDetections(a, a); len(d) != 0 {
		t.Errorf("identical: %v", d)
	}
	b := detections(t, "b", []byte(head+"- name: x2\n  detector: {type: KubeProxySyncStale, factor: 1}\n  for: 5m\n"))
	if d := diffDetections(a, b); len(d) != 1 || !strings.Contains(d[0], "KubeProxyUnhealthy") {
		t.Errorf("missing detector: %v", d)
	}
	c := detections(t, "c", []byte(head+"- name: x\n  detector: {type: KubeProxySyncStale, factor: 2}\n- name: y\n  detector: {type: KubeProxyUnhealthy}\n"))
	if d := diffDetections(a, c); len(d) != 2 {
		t.Errorf("changed parameter: %v", d)
	}
}
