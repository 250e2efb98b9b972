package dataplane

import (
	"fmt"
	"math/rand"
	"reflect"
	"runtime"
	"testing"

	"github.com/remediate-dev/remediate/internal/cluster"
)

// versionedView is a staticView that counts its generation and each
// Service's version the way kube.View does: every change bumps the
// generation and sets the changed Service's version to it.
type verView struct {
	*staticView
	gen  uint64
	vers map[[2]string]uint64
	// during, when set, runs inside the first Endpoints call (an event
	// arriving while the desired state is being derived).
	during func()
}

func newVerView(s *staticView) *verView {
	v := &verView{staticView: s, vers: map[[2]string]uint64{}}
	for _, svc := range s.svcs {
		v.bump(svc.Namespace, svc.Name)
	}
	return v
}

func (v *verView) Generation() uint64 { return v.gen }

func (v *verView) ServiceVersion(ns, name string) uint64 { return v.vers[[2]string{ns, name}] }

func (v *verView) bump(ns, name string) {
	v.gen++
	v.vers[[2]string{ns, name}] = v.gen
}

func (v *verView) Endpoints(ns, name string) []cluster.Endpoint {
	if f := v.during; f != nil {
		v.during = nil
		f()
	}
	return v.staticView.Endpoints(ns, name)
}

// The staticView's Services slice is shared with earlier results: a
// change copies it.
func (v *verView) setService(i int, s cluster.Service) {
	svcs := append([]cluster.Service(nil), v.svcs...)
	svcs[i] = s
	v.svcs = svcs
	v.bump(s.Namespace, s.Name)
}

func (v *verView) setEndpoints(i int, eps []cluster.Endpoint) {
	s := v.svcs[i]
	v.eps[[2]string{s.Namespace, s.Name}] = eps
	v.bump(s.Namespace, s.Name)
}

func (v *verView) deleteService(i int) {
	s := v.svcs[i]
	svcs := append([]cluster.Service(nil), v.svcs[:i]...)
	v.svcs = append(svcs, v.svcs[i+1:]...)
	delete(v.eps, [2]string{s.Namespace, s.Name})
	v.gen++
	delete(v.vers, [2]string{s.Namespace, s.Name})
}

func (v *verView) addService(s cluster.Service, eps []cluster.Endpoint) {
	v.svcs = append(append([]cluster.Service(nil), v.svcs...), s)
	v.eps[[2]string{s.Namespace, s.Name}] = eps
	v.bump(s.Namespace, s.Name)
}

func serviceMemoCounts() (computed uint64) { return servicesDerived.Load() }

// TestDesireIncrementalEqualsDesire: over a view counting Service
// versions, DesireCached after every random change (endpoints rescaled,
// made unready, a Service's ports or traffic policy changed, Services
// deleted and created again under the same name) equals Desire computed
// from scratch, and only the changed Services are derived again.
func TestDesireIncrementalEqualsDesire(t *testing.T) {
	fake, _ := bigCluster(60, 3)
	v := newVerView(snapshotView(fake))
	rng := rand.New(rand.NewSource(1))
	check := func(step string, changed int) {
		t.Helper()
		c0 := serviceMemoCounts()
		got := DesireCached(v, IPv4, "n1")
		c1 := serviceMemoCounts()
		want := Desire(v.staticView, IPv4, "n1")
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%s: incremental desired state differs from Desire:\n%v\n%v", step, desiredLines(got), desiredLines(want))
		}
		if changed >= 0 && int(c1-c0) != changed {
			t.Fatalf("%s: %d Services derived again, want %d (the changed ones)", step, c1-c0, changed)
		}
	}
	check("start", -1)
	check("unchanged", 0) // same generation: the memo, nothing derived
	deleted := map[string]cluster.Service{}
	for step := 0; step < 300; step++ {
		i := rng.Intn(len(v.svcs))
		s := v.svcs[i]
		what := ""
		switch rng.Intn(6) {
		case 0:
			what = "rescaled"
			var eps []cluster.Endpoint
			for j := 0; j < rng.Intn(4); j++ {
				eps = append(eps, cluster.Endpoint{Address: fmt.Sprintf("10.200.%d.%d", step%250, j+1), Port: 8080, Protocol: "TCP", PortName: "http", NodeName: "n1", Ready: true, Serving: true})
			}
			v.setEndpoints(i, eps)
		case 1:
			what = "unready"
			eps := append([]cluster.Endpoint(nil), v.Endpoints(s.Namespace, s.Name)...)
			for j := range eps {
				eps[j].Ready = false
				eps[j].Terminating, eps[j].Serving = true, rng.Intn(2) == 0
			}
			v.setEndpoints(i, eps)
		case 2:
			what = "port changed"
			s.Ports = []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: int32(80 + rng.Intn(3)), NodePort: int32(rng.Intn(2) * 30080)}}
			v.setService(i, s)
		case 3:
			what = "policy local"
			s.InternalPolicyLocal = !s.InternalPolicyLocal
			v.setService(i, s)
		case 4:
			what = "deleted"
			deleted[s.Name] = s
			v.deleteService(i)
			check(fmt.Sprintf("step %d: %s %s", step, s.Name, what), 0)
			continue
		case 5:
			what = "created again"
			for name, d := range deleted {
				v.addService(d, []cluster.Endpoint{{Address: "10.201.0.1", Port: 8080, Protocol: "TCP", PortName: "http", NodeName: "n1", Ready: true, Serving: true}})
				delete(deleted, name)
				s = d
				break
			}
			if s.Name == v.svcs[i].Name && len(deleted) == 0 && what == "created again" && v.vers[[2]string{s.Namespace, s.Name}] != v.gen {
				continue // nothing was deleted
			}
		}
		check(fmt.Sprintf("step %d: %s %s", step, s.Name, what), 1)
	}
	// An unchanged Service's ports are the very same values (shared).
	a := DesireCached(v, IPv4, "n1")
	v.setEndpoints(0, nil)
	b := DesireCached(v, IPv4, "n1")
	for name, dp := range a.Ports {
		if name.Name != v.svcs[0].Name && b.Ports[name] != dp {
			t.Fatalf("%s derived again though its Service did not change", name)
		}
	}
}

// TestDesireIncrementalKeepsNothingReadDuringAChange: a Service changed
// while the desired state is being derived (its event arrives after the
// list of Services was read, before its version is) must not be kept
// with the old Service under its new version: the next derivation, at
// the event's generation, derives it again.
func TestDesireIncrementalKeepsNothingReadDuringAChange(t *testing.T) {
	fake, _ := bigCluster(5, 2)
	v := newVerView(snapshotView(fake))
	DesireCached(v, IPv4, "n3")
	v.setEndpoints(0, nil) // s0 changed: derived again, its endpoints read first
	v.during = func() {
		s1 := v.svcs[1]
		s1.Ports = []cluster.ServicePort{{Name: "http", Protocol: "TCP", Port: 81}}
		v.setService(1, s1)
	}
	DesireCached(v, IPv4, "n3") // read s1 before its change, its version after
	got := DesireCached(v, IPv4, "n3")
	if want := Desire(v.staticView, IPv4, "n3"); !reflect.DeepEqual(got, want) {
		t.Fatalf("a change during the derivation was lost:\n%v\nwant\n%v", desiredLines(got), desiredLines(want))
	}
}

// BenchmarkDesireChurn5kServices: the desired state of a view of 5,000
// Services (5 endpoints each) after one Service changed, as under churn:
// incremental (only the changed Service derived again) against Desire.
func BenchmarkDesireChurn5kServices(b *testing.B) {
	fake, _ := bigCluster(5000, 5)
	for _, mode := range []string{"incremental", "full"} {
		b.Run(mode, func(b *testing.B) {
			v := newVerView(snapshotView(fake))
			DesireCached(v, IPv4, "n1")
			eps := v.Endpoints(v.svcs[7].Namespace, v.svcs[7].Name)
			runtime.GC()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				v.setEndpoints(7, eps[:1+i%len(eps)])
				if mode == "incremental" {
					DesireCached(v, IPv4, "n1")
				} else {
					Desire(v.staticView, IPv4, "n1")
				}
			}
		})
	}
}
