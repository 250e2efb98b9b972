package procident

import (
	"context"
	"fmt"

	"github.com/remediate-dev/remediate/internal/procs"
	"github.com/remediate-dev/remediate/internal/sockdiag"
)

// NewListening returns the Listening of this process's network namespace
// (the node's, with hostNetwork): sock_diag for the sockets, the unified
// cgroup hierarchy under cgroupRoot (--cgroup-root) for their cgroups,
// pr for the processes. An error says why the ports' server cannot be
// told here (no cgroup2 hierarchy mounted): callers then find kube-proxy
// by its name only.
func NewListening(cgroupRoot string, pr procs.Interface) (*Listening, error) {
	tree, err := procs.NewCgroupTree(cgroupRoot)
	if err != nil {
		return nil, fmt.Errorf("kube-proxy's ports cannot be tied to a process: %w", err)
	}
	return &Listening{
		Sockets: func(ctx context.Context, ports ...uint16) ([]sockdiag.Listener, error) {
			return sockdiag.Listeners(ctx, sockdiag.Options{}, ports...)
		},
		Cgroups: tree,
		Procs:   pr,
	}, nil
}
