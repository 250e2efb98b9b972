package main

import (
	"time"

	"github.com/remediate-dev/remediate/internal/cni"
	"github.com/remediate-dev/remediate/internal/cri"
	"github.com/remediate-dev/remediate/internal/node"
)

// cniReadMaxAge is how long one read of the CNI directories serves the
// detectors of a cycle (CNIConfig, HostLocalIPAM): well under any
// detection interval, so each cycle reads afresh.
const cniReadMaxAge = 2 * time.Second

// wireCNIIPAM sets the CNI configuration's shared read, host-local IPAM's
// data directory and the CRI client (subsystem "cri": ListPodSandbox only,
// for HostLocalIPAM's leak check).
func wireCNIIPAM(n *node.Node, o *options) {
	if n.CNIConfDir != "" {
		n.CNI = cni.NewShared(n.CNIConfDir, n.CNIBinDir, cniReadMaxAge)
	}
	n.CNIIPAMDir = o.cniIPAMDir
	if o.criSocket == "" {
		n.Unavailable["cri"] = "no --cri-socket configured (the runtime's sandboxes are not listed)"
		return
	}
	n.CRI = cri.New(o.criSocket, 0)
}
