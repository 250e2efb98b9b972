package realnode_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/remediate-dev/remediate/internal/testing/realnode"
)

// TestNodeKubeletMetricsRBAC scrapes the real kubelet's authenticated
// /metrics (https://<node>:10250/metrics, its self-signed serving cert,
// webhook authentication and authorization) with a ServiceAccount's
// token: refused (403) without RBAC, served (200) once the account may
// get nodes/metrics, and /pods still refused (nothing broader). With REMEDIATE_CAPTURE_KUBELET_METRICS=FILE
// the body is written there (the capture the parser's tests read).
func TestNodeKubeletMetricsRBAC(t *testing.T) {
	n := needNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa, role = "default", "kcni-kubelet-metrics", "kcni-kubelet-metrics"
	c := n.Client
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.CoreV1().ServiceAccounts(ns).Delete(context.Background(), sa, metav1.DeleteOptions{})
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := tr.Status.Token

	// The kubelet's serving certificate is self-signed (--cert-dir, no
	// serving-cert bootstrap), as on most nodes: the test does not verify
	// it; the bearer token is what the kubelet checks.
	hc := n.NetNS.HTTPClient(10 * time.Second)
	hc.Transport.(*http.Transport).TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // see above
	url := fmt.Sprintf("https://%s:10250/metrics", realnode.NodeIP)
	get := func() (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
		return resp.StatusCode, string(b)
	}

	if code, body := get(); code != http.StatusForbidden {
		t.Fatalf("without RBAC: %d, want 403: %.300s", code, body)
	}

	if _, err := c.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes/metrics"}, Verbs: []string{"get"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{})
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer c.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})

	var code int
	var body string
	// The kubelet caches authorization decisions (5 min allowed, 30 s
	// denied by default): the 403 above is cached for up to 30 s.
	if err := n.Poll(ctx, "kubelet /metrics allowed", 90*time.Second, func(context.Context) (bool, string) {
		code, body = get()
		return code == http.StatusOK, fmt.Sprintf("%d %.200s", code, body)
	}); err != nil {
		t.Fatal(err)
	}
	// The sandbox histogram is there once a pod ran; the sandbox error
	// counter and the pod-start SLI histogram are vectors exposed only
	// after their first observation (none on this fresh node).
	if !strings.Contains(body, "kubelet_run_podsandbox_duration_seconds_bucket") {
		t.Errorf("kubelet /metrics lacks kubelet_run_podsandbox_duration_seconds")
	}
	t.Logf("kubelet /metrics: %d bytes, %d lines", len(body), strings.Count(body, "\n"))
	if f := os.Getenv("REMEDIATE_CAPTURE_KUBELET_METRICS"); f != "" {
		if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Another subresource of nodes is still refused: nothing broader.
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://%s:10250/pods", realnode.NodeIP), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("GET /pods with nodes/metrics only: %d, want 403", resp.StatusCode)
	}
}
