package e2e

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/remediate-dev/remediate/deploy"
	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// helmIn runs helm inside the control plane's namespace against its real
// apiserver (the admin kubeconfig), with an isolated helm configuration,
// under a 3-minute deadline; it returns stdout+stderr.
func helmIn(t *testing.T, cp *controlplane.ControlPlane, helm string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	home := t.TempDir()
	cmd := cp.NetNS.CommandContext(ctx, helm, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+cp.AdminKubeconfig,
		"HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_CACHE_HOME="+filepath.Join(home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(home, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestHelmInstallPodSecurity: `helm install` of the chart, with the real
// helm against the real kube-apiserver (Pod Security Admission built in),
// into an existing namespace that enforces baseline or restricted fails
// at once with the reason (the chart's lookup of the namespace's
// pod-security.kubernetes.io/enforce label) and creates nothing; into one
// labelled privileged, one without the label, and a new one
// (--create-namespace), it installs the DaemonSet, and the DaemonSet's
// pod is admitted there (server-side dry run).
func TestHelmInstallPodSecurity(t *testing.T) {
	helm, err := deploy.HelmBin()
	if err != nil {
		if os.Getenv("REMEDIATE_E2E_REQUIRED") != "" {
			t.Fatalf("REMEDIATE_E2E_REQUIRED is set but: %v", err)
		}
		t.Skip(err)
	}
	cp := controlplane.Start(t, controlplane.Options{})
	ctx := context.Background()
	mkNamespace := func(name, level string) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if level != "" {
			ns.Labels = map[string]string{"pod-security.kubernetes.io/enforce": level}
		}
		if _, err := cp.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		ns, level string
		create    bool // the namespace does not exist: --create-namespace
		refused   bool
	}{
		{ns: "psa-baseline", level: "baseline", refused: true},
		{ns: "psa-restricted", level: "restricted", refused: true},
		{ns: "psa-privileged", level: "privileged"},
		{ns: "psa-unlabelled"},
		{ns: "psa-new", create: true},
	} {
		t.Run(c.ns, func(t *testing.T) {
			// One release per namespace, named apart: the chart's
			// cluster-scoped objects carry the release's name.
			release := "remediate-" + strings.TrimPrefix(c.ns, "psa-")
			args := []string{"install", release, deploy.ChartDir(), "--namespace", c.ns}
			if c.create {
				args = append(args, "--create-namespace")
			} else {
				mkNamespace(c.ns, c.level)
			}
			out, err := helmIn(t, cp, helm, args...)
			dss, lerr := cp.Client.AppsV1().DaemonSets(c.ns).List(ctx, metav1.ListOptions{})
			if lerr != nil {
				t.Fatal(lerr)
			}
			if c.refused {
				want := `namespace ` + c.ns + ` enforces Pod Security level "` + c.level + `"`
				if err == nil || !strings.Contains(out, want) || !strings.Contains(out, "privileged") {
					t.Errorf("helm install into a namespace enforcing %s: %v\n%s\nwant it refused with %q", c.level, err, out, want)
				}
				if len(dss.Items) != 0 {
					t.Errorf("refused install left %d DaemonSets in %s", len(dss.Items), c.ns)
				}
				crs, err := cp.Client.RbacV1().ClusterRoles().Get(ctx, release, metav1.GetOptions{})
				if err == nil {
					t.Errorf("refused install left ClusterRole %s", crs.Name)
				}
				t.Logf("refused: %s", strings.TrimSpace(out))
				return
			}
			if err != nil {
				t.Fatalf("helm install into %s (enforce=%q): %v\n%s", c.ns, c.level, err, out)
			}
			if len(dss.Items) != 1 {
				t.Fatalf("%d DaemonSets in %s after install, want 1", len(dss.Items), c.ns)
			}
			ds := dss.Items[0]
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "psa-probe", Namespace: c.ns, Labels: ds.Spec.Template.Labels},
				Spec: *ds.Spec.Template.Spec.DeepCopy()}
			if _, err := cp.Client.CoreV1().Pods(c.ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
				t.Errorf("the installed DaemonSet's pod refused in %s: %v", c.ns, err)
			}
		})
	}
}
