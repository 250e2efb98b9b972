package causes

import (
	"strings"
	"testing"
)

// TestRankSandbox: a classified Event ranks above a broken configuration
// it agrees with, a Ready agent and a free lock are ruled out, and an
// unknown Event kind is not a likely cause.
func TestRankSandbox(t *testing.T) {
	r := RankSandbox(SandboxInputs{
		Events:         &SandboxEvents{Kind: "PluginMissing", Count: 4, Example: `failed to find plugin "bridge" in path [/opt/cni/bin]`, Correlates: "CNIConfig", Pods: 2},
		Config:         &CNIConfigState{Problem: "CNI configuration 10-bridge.conflist names plugins missing from /opt/cni/bin: bridge", InUse: "10-bridge.conflist"},
		Agents:         []AgentState{{Pod: "kube-flannel/kube-flannel-ds-x", Ready: true}},
		AgentsObserved: true,
		Lock:           &LockWindow{},
	})
	if len(r.Likely) != 2 || r.Likely[0].Kind != SandboxFailureEvents || r.Likely[1].Kind != CNIConfigBroken {
		t.Fatalf("likely %+v", r.Likely)
	}
	if !strings.Contains(r.Top(), "PluginMissing x4 (see CNIConfig)") {
		t.Errorf("top %q", r.Top())
	}
	if len(r.RuledOut) != 2 {
		t.Errorf("ruled out %+v, want the agent and the lock", r.RuledOut)
	}
	r = RankSandbox(SandboxInputs{Events: &SandboxEvents{Kind: "Unknown", Count: 1, Pods: 1}, Agents: []AgentState{{Pod: "calico-system/calico-node-y", Restarts: 3}}, AgentsObserved: true})
	if len(r.Likely) != 1 || r.Likely[0].Kind != CNIAgentNotReady || !strings.Contains(r.Top(), "calico-node-y (3 restarts)") {
		t.Fatalf("likely %+v", r.Likely)
	}
	if r := RankSandbox(SandboxInputs{}); len(r.Likely)+len(r.RuledOut) != 0 {
		t.Errorf("nothing observed: %+v", r)
	}
}
