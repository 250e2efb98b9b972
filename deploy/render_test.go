package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
				clusterScoped := map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true,
					"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true}[r.GetKind()]
				if ns := r.GetNamespace(); clusterScoped && ns != "" || !clusterScoped && ns != "kube-system" {
					t.Errorf("%s/%s in namespace %q", r.GetKind(), r.GetName(), ns)
				}
			}
			for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "DaemonSet", "ConfigMap",
				"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
				if kinds[k] != 1 {
					t.Errorf("%d %s, want 1 (%v)", kinds[k], k, kinds)
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
