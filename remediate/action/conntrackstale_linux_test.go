//go:build linux

package action

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/cluster/clustertest"
	"github.com/remediate-dev/remediate/internal/conntrack"
	"github.com/remediate-dev/remediate/internal/conntrack/conntracktest"
	"github.com/remediate-dev/remediate/internal/node"
)

// End to end on the real kernel, in a namespace the test owns, with a fake
// cluster view: ConntrackStaleServiceEntries finds the UDP entries of a
// Service scaled to zero, of a replaced backend, a not-DNATed entry of a
// Service that has endpoints again, and an IPv6 one; FlushConntrack,
// acting on each finding, deletes exactly those; TCP entries, entries to
// serving backends, entries of a Service changed within the grace and
// entries to non-Service addresses stay; a second detection finds nothing.
func TestConntrackStaleServiceEntriesRealKernel(t *testing.T) {
	fd := conntracktest.NetNS(t)
	now := time.Now()
	old, recent := now.Add(-10*time.Minute), now.Add(-10*time.Second)
	udp, tcp := conntrack.ProtoUDP, conntrack.ProtoTCP

	scaledToZero := nflows(5, udp, "10.0.0.5", 20000, "10.96.0.10:53", "10.244.1.5:53")
	scaledToZeroTCP := nflows(3, tcp, "10.0.0.5", 21000, "10.96.0.10:53", "10.244.1.5:53")
	replacedOld := nflows(3, udp, "10.0.0.6", 22000, "10.96.0.20:5353", "10.244.2.1:5353")
	replacedNew := nflows(4, udp, "10.0.0.6", 23000, "10.96.0.20:5353", "10.244.2.2:5353")
	notDNATed := nflows(2, udp, "10.0.0.7", 24000, "10.96.0.20:5353", "10.96.0.20:5353")
	inGrace := nflows(2, udp, "10.0.0.8", 25000, "10.96.0.30:53", "10.244.3.1:53")
	notService := nflows(2, udp, "10.0.0.9", 26000, "8.8.8.8:53", "8.8.8.8:53")
	v6Stale := nflows(2, udp, "fd00::5", 27000, "[fd00:96::d]:53", "[fd00:244::1]:53")
	var all []conntrack.Flow
	for _, l := range [][]conntrack.Flow{scaledToZero, scaledToZeroTCP, replacedOld, replacedNew, notDNATed, inGrace, notService, v6Stale} {
		all = append(all, l...)
	}
	conntracktest.Create(t, fd, all...)

	view := clustertest.New(now)
	svc := func(name, ip string, port int32, changed time.Time) cluster.Service {
		return cluster.Service{Namespace: "ns", Name: name, ClusterIPs: []string{ip}, Type: "ClusterIP",
			Ports: []cluster.ServicePort{{Name: "p", Protocol: "UDP", Port: port}, {Name: "t", Protocol: "TCP", Port: port}}, Created: old.Add(-time.Hour), Changed: changed}
	}
	ready := func(addr string, port int32, changed time.Time) cluster.Endpoint {
		return cluster.Endpoint{Address: addr, Port: port, Protocol: "UDP", PortName: "p", Ready: true, Serving: true, SliceChanged: changed}
	}
	view.SetService(svc("dns", "10.96.0.10", 53, old), []cluster.Endpoint{}...)
	view.SetService(svc("mdns", "10.96.0.20", 5353, old), ready("10.244.2.2", 5353, old))
	view.SetService(svc("fresh", "10.96.0.30", 53, old), []cluster.Endpoint{}...)
	view.SetEndpointsChanged("ns", "fresh", recent)
	view.SetService(svc("dns6", "fd00:96::d", 53, old), []cluster.Endpoint{}...)

	n := &node.Node{Name: "node1", Conntrack: conntrack.New(conntrack.Config{NetNS: fd}), Cluster: view, Clock: clocktesting.NewFakePassiveClock(now)}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dt, _ := detect.Lookup(detect.ConntrackStaleServiceEntriesName)
	d, err := dt.New(dt.NewParams(), n)
	if err != nil {
		t.Fatal(err)
	}
	findings, err := d.Detect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var targets []string
	for _, f := range findings {
		targets = append(targets, fmt.Sprintf("%s=%v", f.Target, f.Evidence["entries"]))
		if c := f.Subject.Conntrack; c == nil || c.Entries != f.Evidence["entries"] {
			t.Errorf("%s: subject %+v, evidence entries %v", f.Target, c, f.Evidence["entries"])
		}
	}
	sort.Strings(targets)
	want := []string{"ipvs-conn/UDP/10.244.1.5:53=5", "ipvs-conn/UDP/10.244.2.1:5353=3", "ipvs-conn/UDP/10.96.0.20:5353=2", "ipvs-conn/UDP/[fd00:244::1]:53=2"}
	if fmt.Sprint(targets) != fmt.Sprint(want) {
		t.Fatalf("findings %v, want %v", targets, want)
	}

	at, _ := Lookup(FlushConntrackName)
	a, err := at.New(&FlushConntrackParams{MaxEntries: 1000}, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range findings {
		if _, err := a.Plan(ctx, f); err != nil {
			t.Fatalf("plan %s: %v", f.Target, err)
		}
		r, err := a.Execute(ctx, f)
		if err != nil || r.Details["deleted"] != f.Evidence["entries"] {
			t.Fatalf("flush %s: %+v, %v; want %v deleted", f.Target, r, err, f.Evidence["entries"])
		}
	}
	var live []conntrack.Flow
	for _, l := range [][]conntrack.Flow{scaledToZeroTCP, replacedNew, inGrace, notService} {
		live = append(live, l...)
	}
	if got, want := flowKeys(conntracktest.Table(t, fd)), flowKeys(live); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("table after the flushes:\n got %v\nwant %v", got, want)
	}
	if again, err := d.Detect(ctx); err != nil || len(again) != 0 {
		t.Fatalf("second detection: %+v, %v; want nothing", again, err)
	}
}
