package causes

import (
	"fmt"
	"strings"
)

// The kinds of cause of failing pod sandboxes (KubeletPodStartup): each
// names the detector whose own finding shows it on this node.
const (
	// SandboxFailureEvents: the kubelet's FailedCreatePodSandBox Events of
	// this node's pods, classified (PodsNetworkNotReady's kinds).
	SandboxFailureEvents Kind = "sandbox-failure-events"
	// CNIConfigBroken: the CNI configuration in use is missing,
	// unloadable, or names a plugin absent from the bin directory
	// (CNIConfig).
	CNIConfigBroken Kind = "cni-config"
	// CNIAgentNotReady: a CNI agent pod of this node not Ready
	// (CNIAgentUnhealthy).
	CNIAgentNotReady Kind = "cni-agent-not-ready"
)

// SandboxEvents is the classified tally of the sandbox Events read.
type SandboxEvents struct {
	// Kind is the top kind (cni.FailureKind), Count its events, Example
	// one sanitised message.
	Kind    string
	Count   int
	Example string
	// Correlates is the detector the kind correlates with ("" none).
	Correlates string
	// Pods is how many pods' Events were read.
	Pods int
}

// CNIConfigState is what CNIConfig would judge of the configuration.
type CNIConfigState struct {
	// Problem is "" when the configuration in use is loadable with every
	// plugin present, else one line saying what is wrong.
	Problem string
	// InUse is the file the runtime loads ("" none).
	InUse string
}

// AgentState is one CNI agent pod of this node.
type AgentState struct {
	Pod      string
	Ready    bool
	Restarts int
}

// SandboxInputs are the observations behind failing pod sandboxes; nil or
// empty fields were not observed.
type SandboxInputs struct {
	Events *SandboxEvents
	Config *CNIConfigState
	// Agents are the CNI agent pods found (AgentsObserved: looked for).
	Agents         []AgentState
	AgentsObserved bool
	Lock           *LockWindow
}

// RankSandbox evaluates the observed causes of failing pod sandboxes and
// ranks them like Rank: a classified Event names the cause outright (score
// 3: it is the runtime's own error text), a broken configuration or a
// not-Ready agent is at its threshold or past it, an xtables lock holder
// other than kube-proxy scores as in Rank.
func RankSandbox(in SandboxInputs) Result {
	var all []Cause
	if e := in.Events; e != nil {
		score := 0.0
		if e.Kind != "" && e.Kind != "Unknown" {
			score = 3
		}
		see := ""
		if e.Correlates != "" {
			see = " (see " + e.Correlates + ")"
		}
		sum := fmt.Sprintf("the kubelet's sandbox Events of %d pods: %s x%d%s: %s", e.Pods, e.Kind, e.Count, see, e.Example)
		if e.Kind == "" {
			sum = fmt.Sprintf("no FailedCreatePodSandBox Event in the %d pods read", e.Pods)
		}
		all = append(all, Cause{Kind: SandboxFailureEvents, Score: score, Summary: sum,
			Figures: []Figure{{"events", float64(e.Count), ""}, {"podsRead", float64(e.Pods), ""}}})
	}
	if c := in.Config; c != nil {
		if c.Problem != "" {
			all = append(all, Cause{Kind: CNIConfigBroken, Score: 2, Summary: c.Problem + " (see CNIConfig)",
				Figures: []Figure{{"broken", 1, ""}}})
		} else {
			all = append(all, Cause{Kind: CNIConfigBroken, Score: 0, Summary: "CNI configuration " + c.InUse + " loadable, its plugins present",
				Figures: []Figure{{"broken", 0, ""}}})
		}
	}
	if in.AgentsObserved {
		var down []string
		for _, a := range in.Agents {
			if !a.Ready {
				down = append(down, fmt.Sprintf("%s (%d restarts)", a.Pod, a.Restarts))
			}
		}
		switch {
		case len(down) > 0:
			all = append(all, Cause{Kind: CNIAgentNotReady, Score: 1.5,
				Summary: "CNI agent pod not Ready: " + strings.Join(down, ", ") + " (see CNIAgentUnhealthy)",
				Figures: []Figure{{"notReady", float64(len(down)), ""}, {"agents", float64(len(in.Agents)), ""}}})
		case len(in.Agents) > 0:
			all = append(all, Cause{Kind: CNIAgentNotReady, Score: 0, Summary: fmt.Sprintf("%d CNI agent pods Ready", len(in.Agents)),
				Figures: []Figure{{"notReady", 0, ""}, {"agents", float64(len(in.Agents)), ""}}})
		}
	}
	if in.Lock != nil {
		r := Rank(Inputs{Lock: in.Lock})
		all = append(all, r.Likely...)
		all = append(all, r.RuledOut...)
	}
	return ranked(all)
}
