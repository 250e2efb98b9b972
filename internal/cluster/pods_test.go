package cluster

import "testing"

func TestAgents(t *testing.T) {
	for _, a := range append(DefaultCNIAgents(), KubeProxyAgent()) {
		if err := a.Validate(); err != nil {
			t.Errorf("default %s: %v", a.Name, err)
		}
	}
	for _, bad := range []Agent{{}, {Name: "x", LabelSelector: "a=b"}, {Name: "x", Namespaces: []string{"ns"}},
		{Name: "x", Namespaces: []string{"ns"}, LabelSelector: "a in ("}, {Name: "x", Namespaces: []string{""}, LabelSelector: "a=b"}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	flannel := Agent{Name: "flannel", Namespaces: []string{"kube-flannel", "kube-system"}, LabelSelector: "app=flannel"}
	pods := []Pod{
		{Namespace: "kube-flannel", Name: "kube-flannel-ds-abc", Labels: map[string]string{"app": "flannel", "tier": "node"}},
		{Namespace: "default", Name: "imitation", Labels: map[string]string{"app": "flannel"}},
		{Namespace: "kube-system", Name: "old", Labels: map[string]string{"app": "flannel"}, Terminating: true},
		{Namespace: "kube-system", Name: "coredns", Labels: map[string]string{"k8s-app": "kube-dns"}},
	}
	got := AgentPods(pods, []Agent{flannel})
	if len(got) != 1 || got[0].Pod.Name != "kube-flannel-ds-abc" || got[0].Agent != "flannel" {
		t.Errorf("agent pods %+v", got)
	}
	if (Agent{Name: "x", Namespaces: []string{"default"}}).Matches(&pods[1]) {
		t.Error("an empty selector matched")
	}
}

func TestPodRef(t *testing.T) {
	r := PodRef{Namespace: "kube-system", Name: "calico-node-x"}
	got, err := ParsePodRef(r.String())
	if err != nil || got != r {
		t.Fatalf("round trip %v %v", got, err)
	}
	for _, bad := range []string{"pod/", "pod/ns", "pod//x", "pod/ns/", "pod/ns/a/b", "process/1@2", "ns/x"} {
		if _, err := ParsePodRef(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestAgentRef(t *testing.T) {
	r := AgentRef{Namespace: "kube-system", Name: "calico-node"}
	got, err := ParseAgentRef(r.String())
	if err != nil || got != r || r.String() != "node-agent/kube-system/calico-node" {
		t.Fatalf("round trip %v %v", got, err)
	}
	for _, bad := range []string{"node-agent/", "node-agent/ns", "node-agent//x", "node-agent/ns/", "node-agent/ns/a/b", "pod/ns/x", "ns/x"} {
		if _, err := ParseAgentRef(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// The controller's name, else the agent's; the same for a replacement.
	pod := Pod{Namespace: "kube-system", Name: "calico-node-x", ControllerName: "calico-node"}
	repl := Pod{Namespace: "kube-system", Name: "calico-node-y", ControllerName: "calico-node"}
	bare := Pod{Namespace: "kube-system", Name: "static-calico"}
	if a, b := (AgentPod{Agent: "calico", Pod: &pod}).Ref(), (AgentPod{Agent: "calico", Pod: &repl}).Ref(); a != r || b != r {
		t.Errorf("refs %v %v, want %v", a, b, r)
	}
	if got := (AgentPod{Agent: "calico", Pod: &bare}).Ref(); got.String() != "node-agent/kube-system/calico" || !got.IsOf("calico", &bare) || got.IsOf("other", &bare) {
		t.Errorf("bare pod's ref %v", got)
	}
}

// FuzzParseAgentRef: any string gives a bounded answer, and what parses
// encodes back to itself.
func FuzzParseAgentRef(f *testing.F) {
	for _, s := range []string{"node-agent/kube-system/calico-node", "node-agent//", "node-agent/a/b/c", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseAgentRef(s)
		if err == nil && r.String() != s {
			t.Fatalf("%q parsed to %+v, encodes to %q", s, r, r.String())
		}
	})
}
