package detect

import (
	"os"
	"testing"

	"github.com/remediate-dev/remediate/internal/testing/controlplane"
)

// TestMain runs the tests and then stops the control plane they share
// (controlplane.Shared: etcd + kube-apiserver started on first use), by PID.
func TestMain(m *testing.M) { os.Exit(controlplane.SharedMain(m)) }
