package kubelet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/remediate-dev/remediate/internal/testing/setpriv"
)

// impostorEnv makes the test binary an impostor kubelet (TestMain): a TLS
// server on 127.0.0.1 with a self-signed certificate that prints its URL,
// then every Authorization header it is sent.
const impostorEnv = "REMEDIATE_TEST_KUBELET_IMPOSTOR"

func TestMain(m *testing.M) {
	if os.Getenv(impostorEnv) == "1" {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Printf("AUTH %q\n", r.Header.Get("Authorization"))
			_, _ = io.WriteString(w, "# impostor\n")
		}))
		srv.StartTLS()
		fmt.Printf("URL %s\n", srv.URL)
		select {} // until killed
	}
	os.Exit(m.Run())
}

// startImpostor runs an unprivileged process (uid 65534, as any user
// could) serving TLS on a port of 127.0.0.1, and returns its URL and a
// function that stops it and returns the Authorization headers it got.
func startImpostor(t *testing.T) (string, func() []string) {
	t.Helper()
	_, bin := setpriv.NobodyCopy(t, "impostor")
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), impostorEnv+"=1")
	cmd.SysProcAttr = setpriv.NobodyAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var url string
	select {
	case l := <-lines:
		url = strings.TrimPrefix(l, "URL ")
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the impostor did not start")
	}
	stop := func() []string {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		var auth []string
		for l := range lines {
			auth = append(auth, l)
		}
		return auth
	}
	t.Cleanup(func() { stop() })
	return url, stop
}

// TestInsecureScrapeRefusesImpostor: with --kubelet-insecure-tls, an
// unprivileged process listening on the kubelet's address (here
// 127.0.0.1, as it could in the kubelet's restart window on 10250) with a
// self-signed certificate gets no token: the socket that accepted the
// connection is uid 65534's, so the connection is closed before the TLS
// handshake, and the error says why. (Before the owner check the
// impostor was sent "Authorization: Bearer good".)
func TestInsecureScrapeRefusesImpostor(t *testing.T) {
	url, stop := startImpostor(t)
	c := newClient(t, Options{URL: url + "/metrics", Auth: &rest.Config{BearerToken: "good"}, InsecureTLS: true, Timeout: 5 * time.Second})
	_, err := c.Metrics(context.Background())
	got := stop()
	if len(got) > 0 {
		t.Fatalf("the impostor was sent %v", got)
	}
	e, ok := AsError(err)
	if !ok || e.Kind != KindNotKubelet || !strings.Contains(err.Error(), "owned by uid 65534") {
		t.Fatalf("err = %v, want %s naming the listener's owner", err, KindNotKubelet)
	}
}

// TestKubeconfigInsecureNotInherited: a kubeconfig that says
// insecure-skip-tls-verify (and so has no CA) does not make the kubelet
// scrape unverified: without --kubelet-ca or --kubelet-insecure-tls there
// is nothing to verify the kubelet against, and New refuses, saying so;
// the self-signed listener is never contacted. (Before, the API's
// Insecure was kept, and any --kubelet-metrics-url, of any host, got the
// token.)
func TestKubeconfigInsecureNotInherited(t *testing.T) {
	srv, hits, _ := kubeletServer(t, nil)
	auth := &rest.Config{BearerToken: "good", TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	c, err := New(Options{URL: srv.URL + "/metrics", Auth: auth, LocalAddress: func(netip.Addr) bool { return false }})
	if err == nil {
		_, err = c.Metrics(context.Background())
	}
	if hits.Load() != 0 {
		t.Fatalf("%d requests with the token reached an unverified listener (err %v)", hits.Load(), err)
	}
	if err == nil || !strings.Contains(err.Error(), "--kubelet-ca") {
		t.Fatalf("err = %v, want a refusal naming --kubelet-ca", err)
	}
	// With a CA given, the kubeconfig's insecure flag still does not
	// skip verification: a CA that did not sign the listener's
	// certificate is a TLS error, before any request.
	c = newClient(t, Options{URL: srv.URL + "/metrics", Auth: auth, CAFile: otherCA(t)})
	_, err = c.Metrics(context.Background())
	if e, ok := AsError(err); !ok || e.Kind != KindTLS || hits.Load() != 0 {
		t.Fatalf("err = %v (%d requests), want a TLS error and none", err, hits.Load())
	}
}

// TestAcceptorUIDDualStackListener: the kubelet listens on 0.0.0.0, which
// Go makes a dual-stack IPv6 socket: a connection to 127.0.0.1 is found in
// /proc/net/tcp6 as ::ffff:127.0.0.1, and its owner (root, this test) is
// the listener's.
func TestAcceptorUIDDualStackListener(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the listener must be root's")
	}
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	for _, host := range []string{"127.0.0.1", "::1"} {
		conn, err := ownerCheckedDial(procNetTCP, &net.Dialer{})(context.Background(), "tcp", net.JoinHostPort(host, fmt.Sprint(port)))
		if err != nil {
			t.Fatalf("%s: a root-owned dual-stack listener refused: %v", host, err)
		}
		conn.Close()
	}
}

// TestAcceptorUIDOfRealConnection: the owner check on a real loopback
// connection finds the accepting socket, and its owner (this test's).
func TestAcceptorUIDOfRealConnection(t *testing.T) {
	srv, _, _ := kubeletServer(t, nil)
	conn, err := ownerCheckedDial(procNetTCP, &net.Dialer{})(context.Background(), "tcp", strings.TrimPrefix(srv.URL, "https://"))
	if os.Geteuid() == 0 {
		if err != nil {
			t.Fatalf("a root-owned listener refused: %v", err)
		}
		conn.Close()
		return
	}
	if !errors.Is(err, ErrNotKubelet) {
		t.Fatalf("err = %v, want %v (the test's listener is not root's)", err, ErrNotKubelet)
	}
}
