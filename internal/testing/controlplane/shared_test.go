package controlplane

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func TestMain(m *testing.M) { os.Exit(SharedMain(m)) }

// TestShared: two tests' views share the processes but not the network
// namespace; each view reaches the apiserver from inside its namespace on
// 127.0.0.1:6443 and on the namespace's address (the `kubernetes`
// Service's endpoint); a view refuses to stop the apiserver; a Namespace's
// contents and the namespace are gone when its test ends; a subtest of a
// holder may take a view.
func TestShared(t *testing.T) {
	var first *ControlPlane
	var nsName, netns string
	t.Run("first", func(t *testing.T) {
		cp := Shared(t)
		first, netns = cp, cp.NetNS.Name
		nsName = cp.Namespace("shared-test")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: nsName},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
		if _, err := cp.Client.CoreV1().Services(nsName).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: nsName}}
		if _, err := cp.Client.CoreV1().ConfigMaps(nsName).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, addr := range []string{"127.0.0.1:6443", cp.NetNS.Address + ":6443"} {
			cfg := rest.CopyConfig(cp.RestConfig)
			cfg.Host = "https://" + addr
			cfg.Dial = cp.NetNS.DialContext // from inside the view's namespace
			c, err := kubernetes.NewForConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			body, err := c.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			if err != nil || strings.TrimSpace(string(body)) != "ok" {
				t.Errorf("readyz through %s in the view's namespace: %v %s", addr, err, body)
			}
		}
		// A view refuses to stop the processes other tests use.
		stub := *cp
		stub.t = &ownerTB{} // its Fatalf panics with ownerFatal
		func() {
			defer func() {
				if f, ok := recover().(ownerFatal); !ok || !strings.Contains(string(f), "shared") {
					t.Errorf("StopAPIServer on a view: %q, want a refusal", f)
				}
			}()
			stub.StopAPIServer()
		}()
		if cp.APIServer().Exited() {
			t.Fatal("a view stopped the shared apiserver")
		}
		t.Run("subtest", func(t *testing.T) {
			sub := Shared(t)
			if sub.APIServer().Pid() != cp.APIServer().Pid() || sub.NetNS.Name == cp.NetNS.Name {
				t.Errorf("subtest view: apiserver pid %d (want %d), namespace %s (parent's %s)",
					sub.APIServer().Pid(), cp.APIServer().Pid(), sub.NetNS.Name, cp.NetNS.Name)
			}
		})
	})
	if t.Failed() {
		t.FailNow()
	}
	if _, err := os.Stat("/run/netns/" + netns); !os.IsNotExist(err) {
		t.Errorf("the first view's network namespace %s is still there: %v", netns, err)
	}

	cp := Shared(t)
	if cp.APIServer().Pid() != first.APIServer().Pid() || cp.Etcd().Pid() != first.Etcd().Pid() {
		t.Errorf("a second control plane was started: apiserver pid %d, first %d", cp.APIServer().Pid(), first.APIServer().Pid())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cp.Client.CoreV1().Namespaces().Get(ctx, nsName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s after its test ended: %v, want not found", nsName, err)
	}
	if l, err := cp.Client.CoreV1().Services(nsName).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("services of %s after its test ended: %v %v", nsName, l, err)
	}
	if l, err := cp.Client.CoreV1().ConfigMaps(nsName).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("config maps of %s after its test ended: %v %v", nsName, l, err)
	}
	if !strings.HasPrefix(nsName, "shared-test-") {
		t.Errorf("namespace name %q", nsName)
	}
}

// TestSharedOverlap: a test may take a view only while no other test (but
// its ancestors) holds one.
func TestSharedOverlap(t *testing.T) {
	for _, c := range []struct {
		active []string
		name   string
		ok     bool
	}{
		{nil, "TestA", true},
		{[]string{"TestA"}, "TestA/sub", true},
		{[]string{"TestA", "TestA/sub"}, "TestA/sub/deeper", true},
		{[]string{"TestA"}, "TestB", false},
		{[]string{"TestA"}, "TestAB", false},
		{[]string{"TestA/x"}, "TestA/y", false},
	} {
		active := map[string]bool{}
		for _, a := range c.active {
			active[a] = true
		}
		msg := overlapping(active, c.name)
		if (msg == "") != c.ok {
			t.Errorf("active %v, %s: %q, want ok=%v", c.active, c.name, msg, c.ok)
		}
		if !c.ok && !strings.Contains(msg, "t.Parallel") {
			t.Errorf("message does not say why: %q", msg)
		}
	}
}
