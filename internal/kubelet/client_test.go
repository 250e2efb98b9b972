package kubelet

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

// kubeletServer is a TLS server on loopback with a self-signed certificate
// (as a kubelet without serverTLSBootstrap), serving the real capture to
// the bearer token "good", 403 with the kubelet's own text to any other,
// and counting requests.
func kubeletServer(t *testing.T, body func(w http.ResponseWriter, r *http.Request)) (*httptest.Server, *atomic.Int32, string) {
	t.Helper()
	capture, err := os.ReadFile("testdata/kubelet-metrics-v1.34.4.txt")
	if err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer good" {
			// The kubelet's answer when the SubjectAccessReview says no.
			http.Error(w, "Forbidden (user=system:serviceaccount:remediate:remediate, verb=get, resource=nodes, subresource(s)=[metrics])", http.StatusForbidden)
			return
		}
		if body != nil {
			body(w, r)
			return
		}
		_, _ = w.Write(capture)
	}))
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "kubelet-ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, &hits, ca
}

// otherCA writes a self-signed CA certificate that signed no server's
// (httptest's servers all share one certificate).
func otherCA(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cluster-ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca := filepath.Join(t.TempDir(), "cluster-ca.crt")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return ca
}

func newClient(t *testing.T, o Options) *Client {
	t.Helper()
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestScrapeVerifiedWithKubeletCA: the kubelet's certificate checked
// against --kubelet-ca, the token sent, the real capture parsed.
func TestScrapeVerifiedWithKubeletCA(t *testing.T) {
	srv, _, ca := kubeletServer(t, nil)
	c := newClient(t, Options{URL: srv.URL + "/metrics", Auth: &rest.Config{BearerToken: "good"}, CAFile: ca})
	sc, err := c.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if sc.Metrics.SandboxDuration == nil || sc.Metrics.SandboxDuration.Count != 1 || sc.Seq != 1 {
		t.Fatalf("scrape %+v", sc)
	}
}

// TestScrapeSelfSignedIsTLSSkipReason: with a CA that does not sign it
// (the cluster's), the self-signed certificate is refused before the
// token is sent (no request reaches the handler), and the error says
// what to configure.
func TestScrapeSelfSignedIsTLSSkipReason(t *testing.T) {
	srv, hits, _ := kubeletServer(t, nil)
	clusterCA := otherCA(t)
	c := newClient(t, Options{URL: srv.URL + "/metrics", Auth: &rest.Config{BearerToken: "good", TLSClientConfig: rest.TLSClientConfig{CAFile: clusterCA}}})
	_, err := c.Metrics(context.Background())
	e, ok := AsError(err)
	if !ok || e.Kind != KindTLS || !strings.Contains(err.Error(), "--kubelet-insecure-tls") {
		t.Fatalf("err = %v, want a TLS error naming the ways out", err)
	}
	if hits.Load() != 0 {
		t.Errorf("%d requests reached the server with an unverified certificate", hits.Load())
	}
}

// TestScrapeForbiddenIsRBAC: the kubelet's 403 is a forbidden error
// naming nodes/metrics, not a bad answer.
func TestScrapeForbiddenIsRBAC(t *testing.T) {
	srv, _, ca := kubeletServer(t, nil)
	c := newClient(t, Options{URL: srv.URL + "/metrics", Auth: &rest.Config{BearerToken: "other"}, CAFile: ca})
	_, err := c.Metrics(context.Background())
	if e, ok := AsError(err); !ok || e.Kind != KindForbidden || !strings.Contains(err.Error(), "nodes/metrics") {
		t.Fatalf("err = %v, want forbidden", err)
	}
}

// TestScrapeInsecureOnlyToThisHost: unverified TLS works to a loopback
// kubelet, and is refused, without any connection, to an address that is
// not this host's (192.0.2.1, TEST-NET-1).
func TestScrapeInsecureOnlyToThisHost(t *testing.T) {
	srv, _, _ := kubeletServer(t, nil)
	c := newClient(t, Options{URL: srv.URL + "/metrics", Auth: &rest.Config{BearerToken: "good"}, InsecureTLS: true})
	if _, err := c.Metrics(context.Background()); err != nil {
		t.Fatalf("insecure to loopback: %v", err)
	}
	far := newClient(t, Options{Address: func() (string, int, error) { return "192.0.2.1", 10250, nil },
		Auth: &rest.Config{BearerToken: "good"}, InsecureTLS: true, Timeout: time.Minute})
	_, err := far.Metrics(context.Background())
	if e, ok := AsError(err); !ok || e.Kind != KindNoAddress || !strings.Contains(err.Error(), "not one") {
		t.Fatalf("insecure to 192.0.2.1: %v, want refused before connecting", err)
	}
}

// TestScrapeBoundedBody: a body over MaxBody is a bad response, not a
// truncated figure.
func TestScrapeBoundedBody(t *testing.T) {
	srv, _, ca := kubeletServer(t, func(w http.ResponseWriter, r *http.Request) {
		line := []byte("# a comment line that only takes room in the body of this test\n")
		for n := 0; n <= MaxBody; n += len(line) {
			if _, err := w.Write(line); err != nil {
				return
			}
		}
	})
	c := newClient(t, Options{URL: srv.URL + "/metrics", Auth: &rest.Config{BearerToken: "good"}, CAFile: ca})
	_, err := c.Metrics(context.Background())
	if e, ok := AsError(err); !ok || e.Kind != KindBadResponse || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("err = %v", err)
	}
}

// TestScrapeHungKubeletBounded: a kubelet that never answers is
// "unreachable" once the client's timeout passes (the test's context has
// no deadline of its own).
func TestScrapeHungKubeletBounded(t *testing.T) {
	release := make(chan struct{})
	srv, _, ca := kubeletServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	})
	defer close(release)
	c := newClient(t, Options{URL: srv.URL + "/metrics", Auth: &rest.Config{BearerToken: "good"}, CAFile: ca, Timeout: 300 * time.Millisecond})
	_, err := c.Metrics(context.Background())
	if e, ok := AsError(err); !ok || e.Kind != KindUnreachable {
		t.Fatalf("err = %v, want unreachable", err)
	}
}

// TestScrapeNoAddressYet: the Node not seen yet is a no-address error.
func TestScrapeNoAddressYet(t *testing.T) {
	c := newClient(t, Options{Address: func() (string, int, error) { return NodeAddress(nil) }, Auth: &rest.Config{BearerToken: "good"}, InsecureTLS: true})
	_, err := c.Metrics(context.Background())
	if e, ok := AsError(err); !ok || e.Kind != KindNoAddress {
		t.Fatalf("err = %v", err)
	}
}

func TestNodeAddress(t *testing.T) {
	n := &corev1.Node{Status: corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "node-a"}, {Type: corev1.NodeExternalIP, Address: "203.0.113.7"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.7"}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}}}}
	if h, p, err := NodeAddress(n); err != nil || h != "10.0.0.7" || p != 10250 {
		t.Fatalf("NodeAddress = %s %d %v", h, p, err)
	}
	n.Status.Addresses = n.Status.Addresses[:1]
	if _, _, err := NodeAddress(n); err == nil {
		t.Fatal("a hostname only: want an error")
	}
}

// TestNewRefusesBadOptions: no credentials, or a plain-HTTP URL.
func TestNewRefusesBadOptions(t *testing.T) {
	for _, o := range []Options{{URL: "https://127.0.0.1:10250/metrics"}, {URL: "http://127.0.0.1:10255/metrics", Auth: &rest.Config{}}, {Auth: &rest.Config{}}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}

// TestScrapeRedirectNotFollowed: a 302 from the kubelet's URL (into a
// second server that would record the token) is an error, not followed:
// the token reaches only the URL asked.
func TestScrapeRedirectNotFollowed(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
	}))
	defer other.Close()
	srv, _, ca := kubeletServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/metrics", http.StatusFound)
	})
	c := newClient(t, Options{URL: srv.URL + "/metrics", Auth: &rest.Config{BearerToken: "good"}, CAFile: ca})
	if _, err := c.Metrics(context.Background()); err == nil {
		t.Fatal("a redirect answered as metrics")
	}
	if elsewhere.Load() != 0 {
		t.Fatalf("the redirect was followed (%d requests elsewhere)", elsewhere.Load())
	}
}
