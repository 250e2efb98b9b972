package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/yaml"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

func TestRenderOverlays(t *testing.T) {
	for _, tc := range []struct{ overlay, mode string }{{"audit", "audit"}, {"enforce", "enforce"}} {
		t.Run(tc.overlay, func(t *testing.T) {
			m, err := Render(tc.overlay)
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]int{}
			var ds appsv1.DaemonSet
			var cms []corev1.ConfigMap
			for _, r := range m.Resources() {
				kinds[r.GetKind()]++
				js, err := r.MarshalJSON()
				if err != nil {
					t.Fatal(err)
				}
				switch r.GetKind() {
				case "DaemonSet":
					if err := yaml.Unmarshal(js, &ds); err != nil {
						t.Fatal(err)
					}
				case "ConfigMap":
					var cm corev1.ConfigMap
					if err := yaml.Unmarshal(js, &cm); err != nil {
						t.Fatal(err)
					}
					cms = append(cms, cm)
				}
				clusterScoped := map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true, "Namespace": true,
					"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}[r.GetKind()]
				// Everything in remediate's own namespace except what it
				// needs in kube-system (Node Events, kube-proxy's
				// DaemonSet; enforce: delete of the node agents' pods).
				want := "remediate"
				if r.GetName() == "remediate-kube-system" || r.GetName() == "remediate-node-agents" || r.GetName() == "remediate-kube-proxy-rollout" {
					want = "kube-system"
				}
				if ns := r.GetNamespace(); clusterScoped && ns != "" || !clusterScoped && ns != want {
					t.Errorf("%s/%s in namespace %q", r.GetKind(), r.GetName(), ns)
				}
			}
			for _, k := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet", "ConfigMap",
				"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
				want := 1
				if k == "Role" || k == "RoleBinding" {
					// Leases and the fleet pause ConfigMap in remediate,
					// events, kube-proxy's DaemonSet and (enforce; empty in
					// audit) pod delete in kube-system.
					want = 5
				}
				if kinds[k] != want {
					t.Errorf("%d %s, want %d (%v)", kinds[k], k, want, kinds)
				}
			}
			if len(cms) != 1 {
				t.Fatalf("configmaps %d", len(cms))
			}
			cm := cms[0]
			if !strings.HasPrefix(cm.Name, "remediate-policy-"+tc.mode+"-") {
				t.Errorf("configmap %s", cm.Name)
			}
			// The shipped policy is exactly the example (whose validity
			// the examples tests check).
			want, err := os.ReadFile(filepath.Join(Dir(), "..", "examples", tc.mode+".yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if cm.Data["policy.yaml"] != string(want) {
				t.Errorf("ConfigMap policy differs from examples/%s.yaml", tc.mode)
			}
			if !strings.Contains(cm.Data["policy.yaml"], "\nmode: "+tc.mode+"\n") {
				t.Errorf("policy is not in %s mode", tc.mode)
			}
			spec := ds.Spec.Template.Spec
			var vol string
			for _, v := range spec.Volumes {
				if v.ConfigMap != nil {
					vol = v.ConfigMap.Name
				}
			}
			if vol != cm.Name {
				t.Errorf("DaemonSet mounts %q, ConfigMap is %q", vol, cm.Name)
			}
			c := spec.Containers[0]
			sc := c.SecurityContext
			if !spec.HostNetwork || !spec.HostPID || spec.PriorityClassName != "system-node-critical" ||
				len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists {
				t.Errorf("pod spec: %+v", spec)
			}
			if sc == nil || sc.Privileged == nil || *sc.Privileged || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
				t.Errorf("security context %+v", sc)
			}
			if c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Error("probes")
			}
			if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Error("resources")
			}
		})
	}
}

// TestDeploySurvivesUsualEdits (issue 18): an overlay of the user's own
// that moves everything into another namespace keeps the admission
// policy's subject; the audit overlay's RBAC cannot change anything; the
// enforce overlay patches the policy volume by name; host /sys is
// read-only except the conntrack parameters in enforce; /metrics listens
// on loopback.
func TestDeploySurvivesUsualEdits(t *testing.T) {
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(Dir(), "overlays", "audit"))
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: ops\nresources:\n- " + rel + "\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := RenderDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var subject string
	for _, r := range m.Resources() {
		js, _ := r.MarshalJSON()
		switch r.GetKind() {
		case "ServiceAccount":
			if r.GetNamespace() != "ops" {
				t.Errorf("ServiceAccount in %q", r.GetNamespace())
			}
			subject = "system:serviceaccount:" + r.GetNamespace() + ":" + r.GetName()
		case "ValidatingAdmissionPolicy":
			var vap admissionv1.ValidatingAdmissionPolicy
			if err := yaml.Unmarshal(js, &vap); err != nil {
				t.Fatal(err)
			}
			expr := vap.Spec.MatchConditions[0].Expression
			if strings.Contains(expr, "kube-system") || !strings.Contains(expr, "startsWith('system:serviceaccount:')") || !strings.Contains(expr, "endsWith(':remediate')") {
				t.Errorf("subject expression %q does not follow the namespace", expr)
			}
		}
	}
	if subject != "system:serviceaccount:ops:remediate" || !strings.HasSuffix(subject, ":remediate") {
		t.Errorf("subject %q", subject)
	}

	verbs := func(overlay string) map[string]bool {
		m, err := Render(overlay)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, r := range m.Resources() {
			if r.GetKind() != "ClusterRole" && r.GetKind() != "Role" {
				continue
			}
			js, _ := r.MarshalJSON()
			var role rbacv1.ClusterRole
			if err := yaml.Unmarshal(js, &role); err != nil {
				t.Fatal(err)
			}
			for _, rule := range role.Rules {
				for _, res := range rule.Resources {
					for _, v := range rule.Verbs {
						out[v+" "+res] = true
					}
				}
			}
		}
		return out
	}
	audit, enforce := verbs("audit"), verbs("enforce")
	for _, v := range []string{"delete pods", "update nodes"} {
		if audit[v] || !enforce[v] {
			t.Errorf("%s: audit %v, enforce %v", v, audit[v], enforce[v])
		}
	}
	for _, v := range []string{"patch nodes/status", "list pods", "create events", "watch services"} {
		if !audit[v] {
			t.Errorf("audit lacks %s", v)
		}
	}

	for _, overlay := range []string{"audit", "enforce"} {
		m, err := Render(overlay)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range m.Resources() {
			if r.GetKind() != "DaemonSet" {
				continue
			}
			js, _ := r.MarshalJSON()
			var ds appsv1.DaemonSet
			if err := yaml.Unmarshal(js, &ds); err != nil {
				t.Fatal(err)
			}
			c := ds.Spec.Template.Spec.Containers[0]
			mounts := map[string]corev1.VolumeMount{}
			for _, vm := range c.VolumeMounts {
				mounts[vm.MountPath] = vm
			}
			if !mounts["/host/sys"].ReadOnly {
				t.Errorf("%s: host /sys writable", overlay)
			}
			_, params := mounts["/host/sys/module/nf_conntrack/parameters"]
			if params != (overlay == "enforce") || (params && mounts["/host/sys/module/nf_conntrack/parameters"].ReadOnly) {
				t.Errorf("%s: conntrack parameters mount %v", overlay, mounts["/host/sys/module/nf_conntrack/parameters"])
			}
			if !slices.Contains(c.Args, "--metrics-addr=127.0.0.1:9808") || c.LivenessProbe.HTTPGet.Host != "127.0.0.1" || c.ReadinessProbe.HTTPGet.Host != "127.0.0.1" {
				t.Errorf("%s: metrics not on loopback: %v", overlay, c.Args)
			}
		}
	}
}

// podDeleters returns the objects of m that grant pod delete, as
// "Kind namespace/name".
func podDeleters(t *testing.T, m resmap.ResMap) []string {
	t.Helper()
	var out []string
	for _, r := range m.Resources() {
		if r.GetKind() != "ClusterRole" && r.GetKind() != "Role" {
			continue
		}
		js, _ := r.MarshalJSON()
		var role rbacv1.ClusterRole
		if err := yaml.Unmarshal(js, &role); err != nil {
			t.Fatal(err)
		}
		for _, rule := range role.Rules {
			if (slices.Contains(rule.Resources, "pods") || slices.Contains(rule.Resources, "*")) &&
				(slices.Contains(rule.Verbs, "delete") || slices.Contains(rule.Verbs, "*")) {
				out = append(out, r.GetKind()+" "+r.GetNamespace()+"/"+r.GetName())
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestPodDeleteNamespaced: pod delete is granted by namespaced Roles in the
// node agents' namespaces only (kube-system; calico-system and kube-flannel
// with their components), never by the ClusterRole, so that without the
// admission policy RBAC alone keeps every other namespace's pods out of
// reach; the audit overlay grants it nowhere.
func TestPodDeleteNamespaced(t *testing.T) {
	for _, tc := range []struct {
		overlay    string
		components []string
		want       []string
	}{
		{"audit", nil, nil},
		{"enforce", nil, []string{"Role kube-system/remediate-node-agents"}},
		{"enforce", []string{"node-agents-calico-system", "node-agents-kube-flannel"},
			[]string{"Role calico-system/remediate-node-agents", "Role kube-flannel/remediate-node-agents", "Role kube-system/remediate-node-agents"}},
	} {
		t.Run(tc.overlay+strings.Join(tc.components, "+"), func(t *testing.T) {
			dir := t.TempDir()
			rel := func(p string) string {
				r, err := filepath.Rel(dir, filepath.Join(Dir(), p))
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel(filepath.Join("overlays", tc.overlay)) + "\n"
			if len(tc.components) > 0 {
				k += "components:\n"
				for _, c := range tc.components {
					k += "- " + rel(filepath.Join("components", c)) + "\n"
				}
			}
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
				t.Fatal(err)
			}
			m, err := RenderDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			if got := podDeleters(t, m); !slices.Equal(got, tc.want) {
				t.Errorf("pod delete granted by %v, want %v", got, tc.want)
			}
			// Each Role that grants it is bound to the ServiceAccount, in
			// the Role's namespace.
			bound := map[string]bool{}
			for _, r := range m.Resources() {
				if r.GetKind() != "RoleBinding" {
					continue
				}
				js, _ := r.MarshalJSON()
				var rb rbacv1.RoleBinding
				if err := yaml.Unmarshal(js, &rb); err != nil {
					t.Fatal(err)
				}
				if len(rb.Subjects) == 1 && rb.Subjects[0].Kind == "ServiceAccount" && rb.Subjects[0].Name == "remediate" && rb.Subjects[0].Namespace == "remediate" {
					bound["Role "+rb.Namespace+"/"+rb.RoleRef.Name] = true
				}
			}
			for _, w := range tc.want {
				if !bound[w] {
					t.Errorf("%s not bound to the ServiceAccount remediate/remediate", w)
				}
			}
		})
	}
}
