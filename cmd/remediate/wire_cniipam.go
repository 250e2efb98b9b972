package main

import (
	"github.com/remediate-dev/remediate/internal/cri"
	"github.com/remediate-dev/remediate/internal/node"
)

// wireCNIIPAM sets host-local IPAM's data directory and the CRI client
// (subsystem "cri": ListPodSandbox only, for HostLocalIPAM's leak check).
func wireCNIIPAM(n *node.Node, o *options) {
	n.CNIIPAMDir = o.cniIPAMDir
	if o.criSocket == "" {
		n.Unavailable["cri"] = "no --cri-socket configured (the runtime's sandboxes are not listed)"
		return
	}
	n.CRI = cri.New(o.criSocket, 0)
}
