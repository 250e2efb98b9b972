package action

import (
	"time"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// RestartKubeProxy is the old name of the kube-proxy restart: policies
// that still say it keep working, with RestartNodeAgent doing the work
// (one action restarts kube-proxy: its identity checks, same-DaemonSet
// replacement and /healthz wait apply). `policy check` notes the
// deprecation, and the engine logs it at every load.

// RestartKubeProxyParams are the parameters of the deprecated
// RestartKubeProxy: one agent named kube-proxy, by namespace and label
// selector (NodeAgentParams).
type RestartKubeProxyParams struct {
	// Namespace of the kube-proxy pods.
	Namespace string `yaml:"namespace"`
	// LabelSelector selecting kube-proxy pods.
	LabelSelector string `yaml:"labelSelector"`
	// ReadyTimeout bounds the wait for the replacement pod to be Ready and,
	// where the kube-proxy adapter is available, for kube-proxy's /healthz
	// to report healthy (its sync recovered). Keep it under actionTimeout:
	// the engine abandons the action at actionTimeout (default 60s), after
	// the pod was deleted, and counts a failed attempt.
	ReadyTimeout policy.Duration `yaml:"readyTimeout"`
	// PollInterval between checks of the replacement pod.
	PollInterval policy.Duration `yaml:"pollInterval"`
}

// SetDefaults sets the defaults of RestartKubeProxy (registry.Defaulter).
func (p *RestartKubeProxyParams) SetDefaults() {
	kp := cluster.KubeProxyAgent()
	*p = RestartKubeProxyParams{Namespace: kp.Namespaces[0], LabelSelector: kp.LabelSelector,
		ReadyTimeout: policy.D(50 * time.Second), PollInterval: policy.D(2 * time.Second)}
}

// Validate implements policy.Validator.
func (p *RestartKubeProxyParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.Namespace == "" {
		errs = append(errs, policy.FieldError{Field: "namespace", Msg: "must not be empty"})
	}
	if sel, err := labels.Parse(p.LabelSelector); err != nil {
		errs = append(errs, policy.FieldError{Field: "labelSelector", Msg: err.Error()})
	} else if sel.Empty() {
		errs = append(errs, policy.FieldError{Field: "labelSelector", Msg: "must not be empty (it would match every pod)"})
	}
	return append(errs, validateReadyWait(p.ReadyTimeout, p.PollInterval)...)
}

// NodeAgentParams are the RestartNodeAgent parameters the old ones mean:
// the allowlist is kube-proxy alone, where they say it lives.
func (p *RestartKubeProxyParams) NodeAgentParams() *RestartNodeAgentParams {
	return &RestartNodeAgentParams{
		Agents:       []cluster.Agent{{Name: cluster.KubeProxyAgent().Name, Namespaces: []string{p.Namespace}, LabelSelector: p.LabelSelector}},
		ReadyTimeout: p.ReadyTimeout, PollInterval: p.PollInterval,
	}
}

// restartKubeProxyDeprecation is the note `policy check` and the engine's
// load log give a rule that still says RestartKubeProxy.
const restartKubeProxyDeprecation = "RestartKubeProxy is deprecated: it runs as RestartNodeAgent restarting kube-proxy alone (agents: [{name: kube-proxy, namespaces: [<namespace>], labelSelector: <labelSelector>}]); write {type: RestartNodeAgent}, whose default agents include kube-proxy (kube-system, k8s-app=kube-proxy)"

func init() {
	Define("RestartKubeProxy",
		"deprecated name of RestartNodeAgent restarting kube-proxy: deletes this node's kube-proxy pod (DaemonSet-managed only), waits for its replacement to be Ready and its /healthz healthy",
		func(p *RestartKubeProxyParams, n *node.Node) (Action, error) {
			return newRestartNodeAgent(p.NodeAgentParams(), n)
		},
		Disruptive(), NeedsAPI(), ActsOn(kubeProxyKinds...), DeprecatedFor("RestartNodeAgent", restartKubeProxyDeprecation))
}

// kubeProxyKinds are the kinds of finding whose remedy is restarting
// kube-proxy (RestartNodeAgent resolves them to the kube-proxy agent).
var kubeProxyKinds = []finding.Kind{finding.KindKubeProxy, finding.KindIPTablesRules, finding.KindIPVSMissingVirtualServer, finding.KindNFTablesTable}
