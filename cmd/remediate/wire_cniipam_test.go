package main

import (
	"testing"

	"github.com/remediate-dev/remediate/internal/cni"
	"github.com/remediate-dev/remediate/internal/node"
)

// TestWireCNISharesOneRead: the daemon's node reads the CNI directories
// through one shared reader (CNIConfig and HostLocalIPAM share a cycle's
// read; detect's TestCNIDetectorsShareOneRead counts the kernel's opens),
// and none without --cni-conf-dir.
func TestWireCNISharesOneRead(t *testing.T) {
	n := &node.Node{CNIConfDir: "/host/etc/cni/net.d", CNIBinDir: "/host/opt/cni/bin", Unavailable: map[string]string{}}
	wireCNIIPAM(n, &options{cniIPAMDir: "/host/var/lib/cni/networks"})
	if _, ok := n.CNI.(*cni.Shared); !ok {
		t.Errorf("node.CNI is %T, want *cni.Shared", n.CNI)
	}
	n = &node.Node{Unavailable: map[string]string{}}
	wireCNIIPAM(n, &options{})
	if n.CNI != nil {
		t.Errorf("no --cni-conf-dir: node.CNI is %T, want none", n.CNI)
	}
}
