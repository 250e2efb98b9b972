package detect

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
)

// CNIConfigParams are the options of CNIConfig.
type CNIConfigParams struct {
	// RequirePlugins checks that every plugin type the configuration in use
	// names is an executable in the CNI bin directory (default true).
	RequirePlugins bool `yaml:"requirePlugins"`
}

// SetDefaults sets the defaults of CNIConfig (registry.Defaulter).
func (p *CNIConfigParams) SetDefaults() { *p = CNIConfigParams{RequirePlugins: true} }

// Validate implements policy.Validator.
func (p *CNIConfigParams) Validate() []policy.FieldError { return nil }

func init() {
	Define("CNIConfig",
		"the node's CNI configuration directory (--cni-conf-dir) missing, empty, its configuration in use unparseable, or naming a plugin missing from --cni-bin-dir",
		newCNIConfig, Targets(finding.KindCNIConfig))
}

// CNIConfigTarget is the target of CNIConfig's finding.
const CNIConfigTarget = "cni/config"

type cniConfig struct {
	p CNIConfigParams
	n *node.Node
	judgement
}

func newCNIConfig(p *CNIConfigParams, n *node.Node) (Detector, error) {
	return &cniConfig{p: *p, n: n}, nil
}

func (d *cniConfig) Detect(ctx context.Context) ([]finding.Finding, error) {
	if d.n.CNIConfDir == "" {
		return nil, finding.Skip("no CNI configuration directory configured (--cni-conf-dir)")
	}
	dir := readCNI(ctx, d.n)
	ev := map[string]any{"confDir": dir.ConfDir, "binDir": dir.BinDir}
	found := func(sev finding.Severity, format string, args ...any) ([]finding.Finding, error) {
		if len(dir.Files) > 0 {
			ev["files"] = dir.Files
		}
		if dir.Omitted > 0 {
			ev["filesOmitted"] = dir.Omitted
		}
		return []finding.Finding{{Detector: "CNIConfig", Target: CNIConfigTarget, Severity: sev,
			Message: fmt.Sprintf(format, args...), Evidence: ev}}, nil
	}
	if dir.ConfDirErr != nil {
		if errors.Is(dir.ConfDirErr, fs.ErrNotExist) {
			why, ok := d.kubernetesNode(ctx)
			if !ok {
				return nil, finding.Skip("CNI configuration directory %s does not exist and this is not evidently a Kubernetes node (%s)", dir.ConfDir, why)
			}
			ev["kubernetesNode"] = why
			return found(finding.Critical, "CNI configuration directory %s does not exist on node %s (or the host path is not mounted here): the runtime cannot set up any pod network", dir.ConfDir, d.n.Name)
		}
		return nil, fmt.Errorf("reading CNI configuration directory %s: %w", dir.ConfDir, dir.ConfDirErr)
	}
	f := dir.InUse()
	if f == nil {
		why, ok := d.kubernetesNode(ctx)
		if !ok {
			return nil, finding.Skip("CNI configuration directory %s holds no network configuration and this is not evidently a Kubernetes node (%s)", dir.ConfDir, why)
		}
		ev["kubernetesNode"] = why
		return found(finding.Critical, "CNI configuration directory %s on node %s holds no network configuration (*.conf, *.conflist, *.json): new pods get no sandbox", dir.ConfDir, d.n.Name)
	}
	ev["inUse"] = f.Name
	if f.Err != "" {
		return found(finding.Critical, "CNI configuration in use %s/%s cannot be loaded: %s (the runtime reads the first file by name; a truncated or overwritten file breaks every new pod's network)", dir.ConfDir, f.Name, f.Err)
	}
	if d.p.RequirePlugins && len(f.MissingPlugins) > 0 {
		why := ""
		if dir.BinDirErr != nil {
			why = fmt.Sprintf(" (%v)", dir.BinDirErr)
		}
		ev["missingPlugins"] = f.MissingPlugins
		return found(finding.Critical, "CNI configuration %s/%s (network %s) names plugins missing from %s%s: %s",
			dir.ConfDir, f.Name, f.Network, dir.BinDir, why, strings.Join(f.MissingPlugins, ", "))
	}
	var broken []string
	for _, g := range dir.Files[1:] {
		if g.Err != "" {
			broken = append(broken, g.Name+": "+g.Err)
		}
	}
	if len(broken) > 0 {
		return found(finding.Warning, "CNI configuration %s/%s is loadable but other files in %s are not (unused while %s sorts first): %s",
			dir.ConfDir, f.Name, dir.ConfDir, f.Name, strings.Join(broken, "; "))
	}
	d.set("CNI configuration %s/%s (network %s, plugins %s) loadable, plugins present in %s", dir.ConfDir, f.Name, f.Network, strings.Join(f.Plugins, ", "), dir.BinDir)
	return nil, nil
}

// kubernetesNode says whether this machine is evidently a Kubernetes node,
// and why (or why not): a missing or empty configuration directory only
// matters where pods are run. Evidence, cheapest first: the watch of this
// node's pods or the cluster view configured (cluster access), or a
// kubelet process. A developer's machine running the daemon without a
// kubeconfig (make run) has none: its missing /etc/cni/net.d is no finding.
func (d *cniConfig) kubernetesNode(ctx context.Context) (string, bool) {
	switch {
	case d.n.Pods != nil:
		return "the pods of node " + d.n.Name + " are watched", true
	case d.n.Cluster != nil:
		return "cluster access is configured", true
	case d.n.Procs == nil:
		return "no cluster access and " + d.n.Why("procs"), false
	}
	ps, err := d.n.Procs.Find(ctx, []string{"kubelet"})
	if err != nil {
		return fmt.Sprintf("no cluster access, and looking for a kubelet process failed: %v", err), false
	}
	if len(ps) > 0 {
		return fmt.Sprintf("kubelet running (pid %d)", ps[0].Pid), true
	}
	return "no cluster access and no kubelet process", false
}
