package main

import (
	"time"

	"github.com/remediate-dev/remediate/internal/cni"
	"github.com/remediate-dev/remediate/internal/cri"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/podlogs"
)

// cniReadMaxAge is how long one read of the CNI directories serves the
// detectors of a cycle (CNIConfig, HostLocalIPAM), and one read of a pod
// log the detectors that read it: well under any detection interval, so
// each cycle reads afresh.
const cniReadMaxAge = 2 * time.Second

// wireCNIIPAM sets the CNI configuration's shared read, host-local IPAM's
// data directory, the pod log reader (--pod-log-dir) and the CRI client (subsystem "cri": ListPodSandbox only,
// for HostLocalIPAM's leak check).
func wireCNIIPAM(n *node.Node, o *options) {
	if n.CNIConfDir != "" {
		n.CNI = cni.NewShared(n.CNIConfDir, n.CNIBinDir, cniReadMaxAge)
	}
	n.CNIIPAMDir = o.cniIPAMDir
	if o.podLogDir == "" {
		n.Unavailable["podlogs"] = "no --pod-log-dir configured (kube-proxy's and the CNI agents' logs are not read)"
	} else {
		n.PodLogs = &podlogs.Shared{R: podlogs.Dir{Root: o.podLogDir}, MaxAge: cniReadMaxAge}
	}
	if o.criSocket == "" {
		n.Unavailable["cri"] = "no --cri-socket configured (the runtime's sandboxes are not listed)"
		return
	}
	n.CRI = cri.New(o.criSocket, 0)
}
