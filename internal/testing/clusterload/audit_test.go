package clusterload

import (
	"strings"
	"testing"
)

// auditSample is what kube-apiserver v1.34.4 writes with AuditPolicy
// (lines cut to the fields read): a daemon's LIST, a watch opened and
// closed, a watch left open, a refused watch (both stages at 403), an
// impersonated request from an unknown address, and a line that is not
// an event.
const auditSample = `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/x/events?fieldSelector=involvedObject.uid%3Du&limit=100&resourceVersion=0","verb":"list","user":{"username":"admin"},"sourceIPs":["10.202.0.2"],"objectRef":{"resource":"events","namespace":"x","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w1","stage":"ResponseStarted","requestURI":"/api/v1/services?watch=true","verb":"watch","user":{"username":"system:kube-proxy"},"sourceIPs":["10.201.0.2"],"objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w2","stage":"ResponseStarted","requestURI":"/api/v1/nodes?watch=true","verb":"watch","user":{"username":"system:kube-proxy"},"sourceIPs":["10.201.0.2"],"objectRef":{"resource":"nodes","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w1","stage":"ResponseComplete","requestURI":"/api/v1/services?watch=true","verb":"watch","user":{"username":"system:kube-proxy"},"sourceIPs":["10.201.0.2"],"objectRef":{"resource":"services","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w3","stage":"ResponseStarted","requestURI":"/api/v1/namespaces/kube-system/configmaps?watch=true","verb":"watch","user":{"username":"admin"},"sourceIPs":["10.202.0.2"],"objectRef":{"resource":"configmaps","namespace":"kube-system","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","code":403}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"w3","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/kube-system/configmaps?watch=true","verb":"watch","user":{"username":"admin"},"sourceIPs":["10.202.0.2"],"objectRef":{"resource":"configmaps","namespace":"kube-system","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","code":403}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"l1","stage":"ResponseComplete","requestURI":"/apis/coordination.k8s.io/v1/namespaces/remediate/leases/remediate-node-n9","verb":"update","user":{"username":"admin"},"impersonatedUser":{"username":"system:serviceaccount:remediate:remediate","extra":{"authentication.kubernetes.io/node-name":["n9"]}},"sourceIPs":["127.0.0.1"],"objectRef":{"resource":"leases","namespace":"remediate","name":"remediate-node-n9","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200}}
{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"h1","stage":"ResponseComplete","requestURI":"/readyz","verb":"get","user":{"username":"admin"},"sourceIPs":["127.0.0.1"],"responseStatus":{"metadata":{},"code":200}}
not json
`

func TestAuditTally(t *testing.T) {
	a := NewAuditTally(map[string]Who{"10.202.0.2": {"n0", "daemon"}, "10.201.0.2": {"n0", "kube-proxy"}})
	used, err := a.Read(strings.NewReader(auditSample + `{"auditID":"partial"`))
	if err != nil {
		t.Fatal(err)
	}
	if int(used) != len(auditSample) {
		t.Errorf("consumed %d bytes, want the %d of the complete lines", used, len(auditSample))
	}
	if a.Events != 8 || a.Bad != 1 {
		t.Errorf("%d events, %d bad", a.Events, a.Bad)
	}
	d, kp := Who{"n0", "daemon"}, Who{"n0", "kube-proxy"}
	want := map[Who]map[Key]int{
		d:                {{Verb: "list", Resource: "events"}: 1, {Verb: "watch", Resource: "configmaps", Code: 403}: 1},
		kp:               {{Verb: "watch", Resource: "services"}: 1, {Verb: "watch", Resource: "nodes"}: 1},
		{"n9", "daemon"}: {{Verb: "update", Resource: "leases"}: 1},
		{Role: "other"}:  {{Verb: "get", Resource: "/readyz"}: 1},
	}
	for w, m := range want {
		for k, v := range m {
			if a.Requests[w][k] != v {
				t.Errorf("%v %v: %d, want %d (all: %v)", w, k, a.Requests[w][k], v, a.Requests)
			}
		}
		if len(a.Requests[w]) != len(m) {
			t.Errorf("%v: %v, want %v", w, a.Requests[w], m)
		}
	}
	if o := a.Open(); o[kp] != 1 || o[d] != 0 || len(o) != 1 {
		t.Errorf("open watches %v, want kube-proxy's nodes watch only", o)
	}
	before := a.Snapshot()
	a.Line([]byte(strings.Split(auditSample, "\n")[0]))
	if dl := Delta(before, a.Snapshot()); len(dl) != 1 || dl[d][Key{Verb: "list", Resource: "events"}] != 1 {
		t.Errorf("delta %v", dl)
	}
	sum, nodes := RoleSum(a.Requests, "daemon")
	if nodes != 2 || sum[Key{Verb: "list", Resource: "events"}] != 2 {
		t.Errorf("daemon sum %v over %d nodes", sum, nodes)
	}
}

func TestParseLinkTxBytes(t *testing.T) {
	m, err := ParseLinkTxBytes([]byte(`[{"ifindex":1,"ifname":"lo","stats64":{"rx":{"bytes":10},"tx":{"bytes":10}}},{"ifindex":5,"link_netnsid":1,"ifname":"fk0","stats64":{"rx":{"bytes":7},"tx":{"bytes":123456789012}}}]`))
	if err != nil || m["fk0"] != 123456789012 || m["lo"] != 10 {
		t.Fatalf("%v %v", m, err)
	}
	if _, err := ParseLinkTxBytes([]byte("Error: no such netns")); err == nil {
		t.Fatal("no error for output that is not JSON")
	}
}

// FuzzAuditTally: any audit log (cut anywhere, with garbage) is counted
// without a panic, every line either an event or bad, and no watch left
// open that did not start.
func FuzzAuditTally(f *testing.F) {
	f.Add([]byte(auditSample))
	f.Add([]byte(`{"auditID":"x","stage":"ResponseComplete","verb":"watch","responseStatus":{"code":500}}` + "\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a := NewAuditTally(map[string]Who{"10.202.0.2": {"n0", "daemon"}})
		used, err := a.Read(strings.NewReader(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Count(string(b[:used]), "\n")
		if a.Events+a.Bad != lines {
			t.Fatalf("%d events + %d bad != %d lines", a.Events, a.Bad, lines)
		}
		starts := 0
		for _, m := range a.Requests {
			for k, v := range m {
				if k.Verb == "watch" && k.Code == 0 {
					starts += v
				}
			}
		}
		open := 0
		for _, n := range a.Open() {
			open += n
		}
		if open > starts {
			t.Fatalf("%d open watches, %d started", open, starts)
		}
	})
}

// FuzzParseLinkTxBytes: any output of `ip -j -s link` is an answer or an
// error, never a panic.
func FuzzParseLinkTxBytes(f *testing.F) {
	f.Add([]byte(`[{"ifname":"fk0","stats64":{"tx":{"bytes":1}}}]`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseLinkTxBytes(b)
	})
}
