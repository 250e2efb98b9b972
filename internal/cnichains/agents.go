// Package cnichains knows the iptables chains the common CNI agents write
// (Flannel, Calico's felix, the AWS VPC CNI, kube-router and Cilium in
// iptables mode), checks an iptables save against them, and remembers the
// agent chains and hooks it has seen (Memory, kept in the state directory
// by FileStore) so that chains which vanish entirely (iptables -F then -X,
// a firewalld reload) are still reported while the agent runs.
//
// Everything here is pure except FileStore: Observe reads a parsed save,
// Check compares an observation with the agent's hooks and the memory,
// Remember folds an observation into the memory.
//
// The chain names and hooks are taken from the agents' own sources; see
// detect/testdata/cniagents/README.md for the repository, path and commit
// of each.
package cnichains

import "strings"

// Hook is a jump an agent puts in a built-in chain to its own chain: From
// (a built-in chain of Table) jumps to To.
type Hook struct {
	Table string `json:"table"`
	From  string `json:"from"`
	To    string `json:"to"`
}

// Key is the hook's memory key, "table/FROM->TO".
func (h Hook) Key() string { return h.Table + "/" + h.From + "->" + h.To }

// String is the hook as a reader says it: "nat POSTROUTING -> FLANNEL-POSTRTG".
func (h Hook) String() string { return h.Table + " " + h.From + " -> " + h.To }

// Agent describes one CNI agent's iptables footprint.
type Agent struct {
	// Name is the agent's name in policies ("flannel", "calico", ...).
	Name string
	// Processes are the argv[0] basenames of the agent's process on the
	// node (the one that writes the rules, and rewrites them on start).
	Processes []string
	// Prefixes are the chain-name prefixes the agent owns.
	Prefixes []string
	// Hooks are the jumps from built-in chains to the agent's top-level
	// chains, as the agent writes them in iptables mode. A hook is checked
	// when its target chain exists (an agent in another mode, or with a
	// feature off, writes none of them), or when it was seen before.
	Hooks []Hook
}

// Owns reports whether chain has one of the agent's prefixes.
func (a Agent) Owns(chain string) bool {
	for _, p := range a.Prefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// Known returns the agents this package knows, in a fixed order.
func Known() []Agent {
	return []Agent{
		{
			// flannel-io/flannel pkg/trafficmngr/iptables/iptables.go:
			// masqRules (nat POSTROUTING "flanneld masq" -j FLANNEL-POSTRTG,
			// with --ip-masq) and forwardRules (filter FORWARD
			// "flanneld forward" -j FLANNEL-FWD).
			Name:      "flannel",
			Processes: []string{"flanneld"},
			Prefixes:  []string{"FLANNEL-"},
			Hooks: []Hook{
				{Table: "nat", From: "POSTROUTING", To: "FLANNEL-POSTRTG"},
				{Table: "filter", From: "FORWARD", To: "FLANNEL-FWD"},
			},
		},
		{
			// projectcalico/calico felix/dataplane/linux/int_dataplane.go
			// setUpIptablesNormal, chain names from felix/rules/rule_defs.go.
			// felix runs as "calico-node -felix".
			Name:      "calico",
			Processes: []string{"calico-node"},
			Prefixes:  []string{"cali-"},
			Hooks: []Hook{
				{Table: "raw", From: "PREROUTING", To: "cali-PREROUTING"},
				{Table: "raw", From: "OUTPUT", To: "cali-OUTPUT"},
				{Table: "mangle", From: "PREROUTING", To: "cali-PREROUTING"},
				{Table: "mangle", From: "POSTROUTING", To: "cali-POSTROUTING"},
				{Table: "nat", From: "PREROUTING", To: "cali-PREROUTING"},
				{Table: "nat", From: "OUTPUT", To: "cali-OUTPUT"},
				{Table: "nat", From: "POSTROUTING", To: "cali-POSTROUTING"},
				{Table: "filter", From: "INPUT", To: "cali-INPUT"},
				{Table: "filter", From: "FORWARD", To: "cali-FORWARD"},
				{Table: "filter", From: "OUTPUT", To: "cali-OUTPUT"},
			},
		},
		{
			// aws/amazon-vpc-cni-k8s pkg/networkutils/network.go
			// (nat POSTROUTING "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0, unless
			// external SNAT) and iptables_connmark.go (nat PREROUTING
			// -i eni+ "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0).
			// ipamd runs as aws-k8s-agent.
			Name:      "aws-vpc-cni",
			Processes: []string{"aws-k8s-agent"},
			Prefixes:  []string{"AWS-SNAT-CHAIN-", "AWS-CONNMARK-CHAIN-"},
			Hooks: []Hook{
				{Table: "nat", From: "POSTROUTING", To: "AWS-SNAT-CHAIN-0"},
				{Table: "nat", From: "PREROUTING", To: "AWS-CONNMARK-CHAIN-0"},
			},
		},
		{
			// cloudnativelabs/kube-router pkg/controllers/netpol
			// (network_policy_controller.go defaultChains,
			// npc_iptables.go ensureTopLevelChains: "kube-router netpol").
			Name:      "kube-router",
			Processes: []string{"kube-router"},
			Prefixes:  []string{"KUBE-ROUTER-"},
			Hooks: []Hook{
				{Table: "filter", From: "INPUT", To: "KUBE-ROUTER-INPUT"},
				{Table: "filter", From: "FORWARD", To: "KUBE-ROUTER-FORWARD"},
				{Table: "filter", From: "OUTPUT", To: "KUBE-ROUTER-OUTPUT"},
			},
		},
		{
			// cilium/cilium pkg/datapath/iptables/iptables.go ciliumChains
			// ("cilium-feeder: CILIUM_*" rules); iptables mode only.
			Name:      "cilium",
			Processes: []string{"cilium-agent"},
			Prefixes:  []string{"CILIUM_"},
			Hooks: []Hook{
				{Table: "filter", From: "INPUT", To: "CILIUM_INPUT"},
				{Table: "filter", From: "OUTPUT", To: "CILIUM_OUTPUT"},
				{Table: "filter", From: "FORWARD", To: "CILIUM_FORWARD"},
				{Table: "raw", From: "OUTPUT", To: "CILIUM_OUTPUT_raw"},
				{Table: "raw", From: "PREROUTING", To: "CILIUM_PRE_raw"},
				{Table: "nat", From: "POSTROUTING", To: "CILIUM_POST_nat"},
				{Table: "nat", From: "OUTPUT", To: "CILIUM_OUTPUT_nat"},
				{Table: "nat", From: "PREROUTING", To: "CILIUM_PRE_nat"},
				{Table: "mangle", From: "POSTROUTING", To: "CILIUM_POST_mangle"},
				{Table: "mangle", From: "PREROUTING", To: "CILIUM_PRE_mangle"},
			},
		},
	}
}

// Names returns the names of the known agents.
func Names() []string {
	var out []string
	for _, a := range Known() {
		out = append(out, a.Name)
	}
	return out
}

// Lookup returns the known agent with that name.
func Lookup(name string) (Agent, bool) {
	for _, a := range Known() {
		if a.Name == name {
			return a, true
		}
	}
	return Agent{}, false
}
