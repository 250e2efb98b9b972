package deploy

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
)

// needHelm returns the helm binary, skipping without one unless
// REMEDIATE_E2E_REQUIRED is set (CI), where a missing helm fails.
func needHelm(t *testing.T) string {
	t.Helper()
	h, err := HelmBin()
	if err != nil {
		if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
			t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %v", err)
		}
		t.Skip(err)
	}
	return h
}

// The chart ships the example policies verbatim (helm cannot read files
// outside the chart, so they are copies; this keeps them identical).
func TestChartPolicyFilesMatchExamples(t *testing.T) {
	for _, mode := range []string{"audit", "enforce"} {
		want, err := os.ReadFile(filepath.Join(Dir(), "..", "examples", mode+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(ChartDir(), "files", mode+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("deploy/helm/remediate/files/%s.yaml differs from examples/%s.yaml: cp examples/%s.yaml deploy/helm/remediate/files/", mode, mode, mode)
		}
	}
}

func TestHelmLint(t *testing.T) {
	helm := needHelm(t)
	ctx := context.Background()
	for _, set := range [][]string{nil, {"--set", "enforce=true"},
		{"--set", "prometheusRule.enabled=true,metrics.podMonitor.enabled=true,metrics.bindAddress=,cleanupOnUninstall.enabled=false,admissionPolicy.enabled=false"},
		{"--set", "image.digest=sha256:" + strings.Repeat("ab", 32)}} {
		out, err := Helm(ctx, helm, append([]string{"lint", "--strict", ChartDir()}, set...)...)
		if err != nil {
			t.Errorf("helm lint %v: %v\n%s", set, err, out)
		}
	}
}

// TestChartMatchesKustomize is what keeps the chart and deploy/base in
// sync: rendered with default values (audit) and with enforce=true, the
// chart's installed objects equal the audit and enforce overlays' objects
// one by one, after Normalize (Helm's bookkeeping labels, kustomize's
// ConfigMap hash, the image tag). A change to deploy/base fails here until
// the chart follows (or the other way round).
func TestChartMatchesKustomize(t *testing.T) {
	helm := needHelm(t)
	for _, tc := range []struct {
		overlay string
		set     []string
	}{{"audit", nil}, {"enforce", []string{"--set", "enforce=true"}}} {
		t.Run(tc.overlay, func(t *testing.T) {
			m, err := Render(tc.overlay)
			if err != nil {
				t.Fatal(err)
			}
			kobjs, err := KustomizeObjects(m)
			if err != nil {
				t.Fatal(err)
			}
			// The exception lists must name objects that exist: a stale
			// entry would hide nothing today and anything tomorrow.
			seen := map[string]bool{}
			var kept []*unstructured.Unstructured
			for _, o := range kobjs {
				if KustomizeOnly[ObjectKey(o)] {
					seen[ObjectKey(o)] = true
					continue
				}
				kept = append(kept, o)
			}
			kobjs = kept
			hobjs, err := RenderChart(context.Background(), helm, ChartNamespace, tc.set...)
			if err != nil {
				t.Fatal(err)
			}
			var installed []*unstructured.Unstructured
			for _, o := range hobjs {
				if ChartOnly[ObjectKey(o)] {
					seen[ObjectKey(o)] = true
					continue
				}
				if !IsHook(o) {
					installed = append(installed, o)
				}
			}
			for k := range KustomizeOnly {
				if !seen[k] {
					t.Errorf("KustomizeOnly lists %s, which the overlay does not render", k)
				}
			}
			for k := range ChartOnly {
				if !seen[k] {
					t.Errorf("ChartOnly lists %s, which the chart does not render in namespace %s", k, ChartNamespace)
				}
			}
			for _, o := range append(kobjs, installed...) {
				Normalize(o)
			}
			km, kkeys := ByKey(kobjs)
			hm, hkeys := ByKey(installed)
			if d := cmp.Diff(kkeys, hkeys); d != "" {
				t.Errorf("objects differ (-kustomize +chart):\n%s", d)
			}
			for _, k := range kkeys {
				h, ok := hm[k]
				if !ok {
					continue
				}
				if d := cmp.Diff(km[k].Object, h.Object); d != "" {
					t.Errorf("%s differs (-kustomize +chart):\n%s", k, d)
				}
			}
		})
	}
}

// TestChartValues: the values that matter render as documented, and the
// strict schema refuses what it should.
func TestChartValues(t *testing.T) {
	helm := needHelm(t)
	ctx := context.Background()
	render := func(t *testing.T, args ...string) map[string]*unstructured.Unstructured {
		t.Helper()
		objs, err := RenderChart(ctx, helm, "ops", args...)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := ByKey(objs)
		return m
	}
	container := func(t *testing.T, m map[string]*unstructured.Unstructured) map[string]any {
		t.Helper()
		ds := m["DaemonSet ops/remediate"]
		if ds == nil {
			t.Fatalf("no DaemonSet in %v", m)
		}
		cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		return cs[0].(map[string]any)
	}
	t.Run("defaults", func(t *testing.T) {
		m := render(t)
		c := container(t, m)
		if c["image"] != "ghcr.io/remediate-dev/remediate:0.1.0" {
			t.Errorf("image %v", c["image"])
		}
		cm := m["ConfigMap ops/remediate-policy-audit"]
		if cm == nil {
			t.Fatal("no audit policy ConfigMap")
		}
		pol, _, _ := unstructured.NestedString(cm.Object, "data", "policy.yaml")
		p, err := policy.Parse("chart", []byte(pol), remediate.Catalog{})
		if err != nil || p.Mode != policy.Audit {
			t.Errorf("policy: %v mode %v", err, p)
		}
		for k, o := range m {
			if o.GetKind() == "PrometheusRule" || o.GetKind() == "PodMonitor" {
				t.Errorf("%s rendered by default", k)
			}
		}
		// The uninstall cleanup: a hook Job running `remediate cleanup`
		// before and after the release's objects are deleted, as its own
		// ServiceAccount.
		job := m["Job ops/remediate-cleanup"]
		if job == nil || !IsHook(job) || job.GetAnnotations()["helm.sh/hook"] != "pre-delete,post-delete" {
			t.Fatalf("cleanup hook Job: %v", job)
		}
		jc, _, _ := unstructured.NestedSlice(job.Object, "spec", "template", "spec", "containers")
		args, _, _ := unstructured.NestedStringSlice(jc[0].(map[string]any), "args")
		sa, _, _ := unstructured.NestedString(job.Object, "spec", "template", "spec", "serviceAccountName")
		if len(args) == 0 || args[0] != "cleanup" || sa != "remediate-cleanup" || jc[0].(map[string]any)["image"] != c["image"] {
			t.Errorf("cleanup Job: args %v, ServiceAccount %q, image %v", args, sa, jc[0].(map[string]any)["image"])
		}
		if m["ClusterRole /remediate-cleanup"] == nil || !IsHook(m["ClusterRole /remediate-cleanup"]) {
			t.Error("cleanup ClusterRole missing or not a hook")
		}
	})
	t.Run("digest", func(t *testing.T) {
		d := "sha256:" + strings.Repeat("0f", 32)
		c := container(t, render(t, "--set", "image.digest="+d, "--set", "image.tag=1.2.3"))
		if c["image"] != "ghcr.io/remediate-dev/remediate:1.2.3@"+d {
			t.Errorf("image %v", c["image"])
		}
	})
	t.Run("custom-policy-enforce", func(t *testing.T) {
		f := filepath.Join(t.TempDir(), "v.yaml")
		src, err := os.ReadFile(filepath.Join(Dir(), "..", "examples", "audit.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		var custom map[string]any
		if err := yaml.Unmarshal(src, &custom); err != nil {
			t.Fatal(err)
		}
		v, _ := yaml.Marshal(map[string]any{"enforce": true, "policy": map[string]any{"custom": custom}})
		if err := os.WriteFile(f, v, 0o644); err != nil {
			t.Fatal(err)
		}
		m := render(t, "-f", f)
		cm := m["ConfigMap ops/remediate-policy-enforce"]
		if cm == nil {
			t.Fatalf("no enforce ConfigMap: %v", m)
		}
		pol, _, _ := unstructured.NestedString(cm.Object, "data", "policy.yaml")
		p, err := policy.Parse("chart", []byte(pol), remediate.Catalog{})
		if err != nil {
			t.Fatalf("custom policy as rendered is invalid: %v\n%s", err, pol)
		}
		if p.Mode != policy.Enforce || len(p.Rules) == 0 {
			t.Errorf("mode %v, %d rules", p.Mode, len(p.Rules))
		}
	})
	t.Run("existing-configmap", func(t *testing.T) {
		m := render(t, "--set", "policy.existingConfigMap=my-policy")
		for k, o := range m {
			if o.GetKind() == "ConfigMap" {
				t.Errorf("rendered %s", k)
			}
		}
		ds := m["DaemonSet ops/remediate"]
		vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		found := false
		for _, v := range vols {
			if n, _, _ := unstructured.NestedString(v.(map[string]any), "configMap", "name"); n == "my-policy" {
				found = true
			}
		}
		if !found {
			t.Errorf("DaemonSet does not mount my-policy: %v", vols)
		}
	})
	// The admission policy follows the ServiceAccount's name (in any
	// namespace, as deploy/base has it).
	t.Run("service-account-name", func(t *testing.T) {
		m := render(t, "--set", "serviceAccount.name=guard")
		ad := m["ValidatingAdmissionPolicy /remediate-own-node"]
		expr, _, _ := unstructured.NestedSlice(ad.Object, "spec", "matchConditions")
		if !strings.Contains(expr[0].(map[string]any)["expression"].(string), "endsWith(':guard')") {
			t.Errorf("admission policy does not name the release's ServiceAccount: %v", expr)
		}
		if m["ServiceAccount ops/guard"] == nil {
			t.Error("no ServiceAccount ops/guard")
		}
	})
	// /metrics on loopback by default; bindAddress "" listens on every
	// address, the probes stay on loopback. The chart never renders the
	// release namespace (helm install --create-namespace).
	t.Run("metrics-bind-address", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{{nil, "--metrics-addr=127.0.0.1:9808"}, {[]string{"--set", "metrics.bindAddress="}, "--metrics-addr=:9808"}} {
			m := render(t, tc.args...)
			for k := range m {
				if strings.HasPrefix(k, "Namespace ") {
					t.Errorf("chart renders %s", k)
				}
			}
			c := container(t, m)
			args, _, _ := unstructured.NestedStringSlice(c, "args")
			if !strings.Contains(strings.Join(args, " "), tc.want) {
				t.Errorf("%v: args %v, want %s", tc.args, args, tc.want)
			}
			host, _, _ := unstructured.NestedString(c, "livenessProbe", "httpGet", "host")
			if host != "127.0.0.1" {
				t.Errorf("%v: liveness probe host %q", tc.args, host)
			}
		}
	})
	// Pod delete: only in enforce, only in nodeAgents.namespaces (one Role
	// and RoleBinding each), never cluster-wide.
	t.Run("node-agents-namespaces", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{nil, nil},
			{[]string{"--set", "nodeAgents.namespaces={kube-system,calico-system}"}, nil},
			{[]string{"--set", "enforce=true"}, []string{"kube-system"}},
			{[]string{"--set", "enforce=true", "--set", "nodeAgents.namespaces={kube-system,calico-system}"}, []string{"calico-system", "kube-system"}},
			{[]string{"--set", "enforce=true", "--set-json", "nodeAgents.namespaces=[]"}, nil},
		} {
			m := render(t, tc.args...)
			var got []string
			for k, o := range m {
				if o.GetKind() != "ClusterRole" && o.GetKind() != "Role" || IsHook(o) {
					continue
				}
				rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
				for _, r := range rules {
					res, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "resources")
					verbs, _, _ := unstructured.NestedStringSlice(r.(map[string]any), "verbs")
					if slices.Contains(res, "pods") && slices.Contains(verbs, "delete") {
						if o.GetKind() != "Role" || o.GetName() != "remediate-node-agents" {
							t.Errorf("%v: %s grants pod delete", tc.args, k)
						}
						got = append(got, o.GetNamespace())
						rb := m["RoleBinding "+o.GetNamespace()+"/remediate-node-agents"]
						if rb == nil {
							t.Errorf("%v: %s has no RoleBinding", tc.args, k)
							continue
						}
						subj, _, _ := unstructured.NestedSlice(rb.Object, "subjects")
						if len(subj) != 1 || subj[0].(map[string]any)["namespace"] != "ops" || subj[0].(map[string]any)["name"] != "remediate" {
							t.Errorf("%v: %s not bound to ops/remediate: %v", tc.args, k, rb)
						}
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.want) {
				t.Errorf("%v: pod delete in %v, want %v", tc.args, got, tc.want)
			}
		}
	})
	// hostPortRepair (issue 37): nothing by default; with namespaces, in
	// enforce only, one Role and RoleBinding each granting pod delete
	// there, and the admission policy's hostPortPod names them (the
	// policy's other conditions: controller-owned, a hostPort, own node).
	t.Run("host-port-repair", func(t *testing.T) {
		for _, tc := range []struct {
			args    []string
			roles   []string
			listing string
		}{
			{nil, nil, "[]"},
			{[]string{"--set", "enforce=true"}, nil, "[]"},
			{[]string{"--set", "hostPortRepair.namespaces={apps}"}, nil, `["apps"]`},
			{[]string{"--set", "enforce=true", "--set", "hostPortRepair.namespaces={apps,web}"}, []string{"apps", "web"}, `["apps","web"]`},
		} {
			m := render(t, tc.args...)
			var got []string
			for k, o := range m {
				if o.GetName() != "remediate-host-port-repair" {
					continue
				}
				if o.GetKind() == "Role" {
					rules, _, _ := unstructured.NestedSlice(o.Object, "rules")
					res, _, _ := unstructured.NestedStringSlice(rules[0].(map[string]any), "resources")
					verbs, _, _ := unstructured.NestedStringSlice(rules[0].(map[string]any), "verbs")
					if len(rules) != 1 || !slices.Equal(res, []string{"pods"}) || !slices.Equal(verbs, []string{"delete"}) {
						t.Errorf("%v: %s rules %v", tc.args, k, rules)
					}
					got = append(got, o.GetNamespace())
					rb := m["RoleBinding "+o.GetNamespace()+"/remediate-host-port-repair"]
					if rb == nil {
						t.Errorf("%v: %s has no RoleBinding", tc.args, k)
						continue
					}
					subj, _, _ := unstructured.NestedSlice(rb.Object, "subjects")
					if len(subj) != 1 || subj[0].(map[string]any)["namespace"] != "ops" || subj[0].(map[string]any)["name"] != "remediate" {
						t.Errorf("%v: %s not bound to ops/remediate: %v", tc.args, k, rb)
					}
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, tc.roles) {
				t.Errorf("%v: host-port-repair Roles in %v, want %v", tc.args, got, tc.roles)
			}
			ad := m["ValidatingAdmissionPolicy /remediate-own-node"]
			vars, _, _ := unstructured.NestedSlice(ad.Object, "spec", "variables")
			listing, hostPortPod := "", ""
			for _, v := range vars {
				switch v.(map[string]any)["name"] {
				case "hostPortRepairNamespaces":
					listing = v.(map[string]any)["expression"].(string)
				case "hostPortPod":
					hostPortPod = v.(map[string]any)["expression"].(string)
				}
			}
			if listing != tc.listing {
				t.Errorf("%v: admission hostPortRepairNamespaces %q, want %q", tc.args, listing, tc.listing)
			}
			for _, w := range []string{"in variables.hostPortRepairNamespaces", "r.controller", "r.kind != 'Node'", "kubernetes.io/config.mirror", "hostNetwork", "p.hostPort > 0"} {
				if !strings.Contains(hostPortPod, w) {
					t.Errorf("%v: admission hostPortPod lacks %q: %s", tc.args, w, hostPortPod)
				}
			}
			vals, _, _ := unstructured.NestedSlice(ad.Object, "spec", "validations")
			if !strings.Contains(fmt.Sprint(vals), "(variables.agentPod || variables.hostPortPod)") {
				t.Errorf("%v: the pod delete validation does not allow hostPortPod: %v", tc.args, vals)
			}
		}
	})
	// kube-system (issue 27, item 11): the admission policy confines the
	// Lease writes by name there; without it the chart refuses to render.
	t.Run("kube-system", func(t *testing.T) {
		objs, err := RenderChart(ctx, helm, "kube-system")
		if err != nil {
			t.Fatalf("kube-system with the admission policy: %v", err)
		}
		m, _ := ByKey(objs)
		if m["ValidatingAdmissionPolicy /remediate-own-node"] == nil {
			t.Error("no admission policy")
		}
		_, err = RenderChart(ctx, helm, "kube-system", "--set", "admissionPolicy.enabled=false")
		if err == nil || !strings.Contains(err.Error(), "namespace kube-system with admissionPolicy.enabled=false is refused") {
			t.Errorf("kube-system without the admission policy: %v", err)
		}
		if _, err := RenderChart(ctx, helm, "ops", "--set", "admissionPolicy.enabled=false"); err != nil {
			t.Errorf("another namespace without the admission policy: %v", err)
		}
	})
	for name, args := range map[string][]string{
		"bad-agent-namespace":                {"--set", "nodeAgents.namespaces={Kube_System}"},
		"dup-agent-namespace":                {"--set", "nodeAgents.namespaces={kube-system,kube-system}"},
		"latest":                             {"--set", "image.tag=latest"},
		"unknown-key":                        {"--set", "enforcee=true"},
		"enforce-not-bool":                   {"--set-string", "enforce=yes"},
		"bad-digest":                         {"--set", "image.digest=sha256:abc"},
		"existing-and-enforce":               {"--set", "policy.existingConfigMap=x,enforce=true"},
		"unknown-nested":                     {"--set", "resources.requests.gpu=1"},
		"bad-mode":                           {"--set", "policy.custom.mode=fix"},
		"bad-bind-address":                   {"--set", "metrics.bindAddress=0.0.0.0:9808"},
		"podmonitor-loopback":                {"--set", "metrics.podMonitor.enabled=true"},
		"host-port-repair-without-admission": {"--set", "enforce=true,hostPortRepair.namespaces={apps},admissionPolicy.enabled=false"},
		"bad-host-port-namespace":            {"--set", "hostPortRepair.namespaces={Apps_1}"},
	} {
		t.Run("refuses-"+name, func(t *testing.T) {
			if _, err := RenderChart(ctx, helm, "ops", args...); err == nil {
				t.Errorf("helm template %v succeeded", args)
			}
		})
	}
}

// TestSysPtraceOptIn (issue 27, item 12; issue 41, item 3): by default the
// overlays and the chart grant exactly NET_ADMIN, NET_RAW and KILL: no
// CAP_SYS_PTRACE and no DAC_READ_SEARCH (open_by_handle_at: cmd/remediate
// TestHostRoutes); the chart's sysPtrace=true and the component
// deploy/components/sys-ptrace grant SYS_PTRACE and DAC_READ_SEARCH, and
// render the same DaemonSet.
func TestSysPtraceOptIn(t *testing.T) {
	defaultCaps := []string{"NET_ADMIN", "NET_RAW", "KILL"}
	helm := needHelm(t)
	ctx := context.Background()
	caps := func(t *testing.T, objs []*unstructured.Unstructured) []string {
		t.Helper()
		for _, o := range objs {
			if o.GetKind() != "DaemonSet" {
				continue
			}
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			add, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "securityContext", "capabilities", "add")
			return add
		}
		t.Fatal("no DaemonSet")
		return nil
	}
	for _, overlay := range []string{"audit", "enforce"} {
		m, err := Render(overlay)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := KustomizeObjects(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := caps(t, objs); !slices.Equal(got, defaultCaps) {
			t.Errorf("overlay %s adds %v, want %v", overlay, got, defaultCaps)
		}
	}
	hobjs, err := RenderChart(ctx, helm, ChartNamespace)
	if err != nil {
		t.Fatal(err)
	}
	if got := caps(t, hobjs); !slices.Equal(got, defaultCaps) {
		t.Errorf("chart defaults add %v, want %v", got, defaultCaps)
	}

	dir := t.TempDir()
	rel := func(p ...string) string {
		r, err := filepath.Rel(dir, filepath.Join(append([]string{Dir()}, p...)...))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel("overlays", "enforce") +
		"\ncomponents:\n- " + rel("components", "sys-ptrace") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := RenderDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	kobjs, err := KustomizeObjects(m)
	if err != nil {
		t.Fatal(err)
	}
	hobjs, err = RenderChart(ctx, helm, ChartNamespace, "--set", "enforce=true", "--set", "sysPtrace=true")
	if err != nil {
		t.Fatal(err)
	}
	kc, hc := caps(t, kobjs), caps(t, hobjs)
	if want := append(slices.Clone(defaultCaps), "DAC_READ_SEARCH", "SYS_PTRACE"); !slices.Equal(kc, want) {
		t.Errorf("component sys-ptrace adds %v, want %v", kc, want)
	}
	if !slices.Equal(kc, hc) {
		t.Errorf("capabilities differ: kustomize+component %v, chart sysPtrace=true %v", kc, hc)
	}
	var kds, hds *unstructured.Unstructured
	for _, o := range kobjs {
		if o.GetKind() == "DaemonSet" {
			kds = o
		}
	}
	for _, o := range hobjs {
		if o.GetKind() == "DaemonSet" {
			hds = o
		}
	}
	Normalize(kds)
	Normalize(hds)
	if d := cmp.Diff(kds.Object, hds.Object); d != "" {
		t.Errorf("DaemonSet differs (-kustomize+sys-ptrace +chart sysPtrace=true):\n%s", d)
	}
}
