package detect

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/node"
)

// TestHostLocalIPAMUsePodCIDR: a configuration whose subnet is
// "usePodCidr" (filled in by a wrapper at ADD time) is judged against the
// Node's podCIDR, as host-local then gets it: the real host-local plugin
// fills the Node's 10.97.0.0/29 (5 addresses: .1-.6 less the gateway) and the
// finding is critical. Without the Node's podCIDR the ranges stay unknown
// and the evidence says why.
func TestHostLocalIPAMUsePodCIDR(t *testing.T) {
	ctx := context.Background()
	confDir, data := t.TempDir(), t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"0.3.1","name":"kubenet","plugins":[{"type":"bridge","bridge":"cbr0","ipam":{"type":"host-local","subnet":"usePodCidr","dataDir":%q}}]}`, data)
	if err := os.WriteFile(filepath.Join(confDir, "10-kubenet.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// What the wrapper hands host-local: the Node's podCIDR.
	plugin := fmt.Sprintf(`{"cniVersion":"0.3.1","name":"kubenet","type":"bridge","ipam":{"type":"host-local","subnet":"10.97.0.0/29","dataDir":%q}}`, data)
	for i := 1; i <= 5; i++ {
		if err := hostLocalADD(t, plugin, strings.Repeat(fmt.Sprint(i), 64)); err != nil {
			t.Fatalf("ADD %d: %v", i, err)
		}
	}
	if err := hostLocalADD(t, plugin, strings.Repeat("6", 64)); err == nil || !strings.Contains(err.Error(), "no IP addresses available") {
		t.Fatalf("a sixth ADD in a /29: %v, want exhausted", err)
	}
	kube := fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}, Spec: corev1.NodeSpec{PodCIDR: "10.97.0.0/29", PodCIDRs: []string{"10.97.0.0/29"}}})
	n := &node.Node{Name: "node1", Clock: clocktesting.NewFakePassiveClock(time.Now()), CNIConfDir: confDir, CNIIPAMDir: "/nonexistent", Kube: kube,
		Unavailable: map[string]string{"cri": "no --cri-socket"}}
	d := newIssue3Detector(t, "HostLocalIPAM", n, nil)
	fs, err := d.Detect(ctx)
	if err != nil || len(fs) != 1 || fs[0].Severity != finding.Critical || !strings.Contains(fs[0].Message, "5 of 5 addresses of 10.97.0.1-10.97.0.6") {
		t.Fatalf("usePodCidr against the Node's podCIDR: %+v %v", fs, err)
	}
	if u := fmt.Sprint(fs[0].Evidence["rangesUnknown"]); !strings.Contains(u, "the Node's podCIDRs used instead: [10.97.0.0/29]") {
		t.Errorf("rangesUnknown %q", u)
	}
	// No Node podCIDR: no verdict on usage, and the judged line says so.
	n2 := &node.Node{Name: "node1", Clock: n.Clock, CNIConfDir: confDir, CNIIPAMDir: "/nonexistent",
		Kube: fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node1"}}), Unavailable: n.Unavailable}
	d2 := newIssue3Detector(t, "HostLocalIPAM", n2, nil)
	if fs, err := d2.Detect(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("no podCIDR: %+v %v", fs, err)
	}
}
