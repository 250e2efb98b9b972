// Package clusterload fills a real apiserver (internal/testing/controlplane)
// with kube-proxy-shaped Services and EndpointSlices, churns them at a
// given rate, and measures processes (CPU from /proc/PID/stat, RSS from
// /proc/PID/status): the machinery of `make bench-load`'s cluster phases
// and of `make bench-fleet`. Nothing here is a timed test: the numbers are
// printed for docs/SCALE.md.
package clusterload

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Namespaces is how many namespaces the Services are spread over.
const Namespaces = 10

// ServiceRef names one generated Service.
type ServiceRef struct{ Namespace, Name string }

// Populate creates Services svc-<from>..svc-<to-1> (ClusterIP, one TCP
// port "http" 80 -> 8080), each with one EndpointSlice of eps ready
// endpoints on nodes named node-<k % nodes> (nodes 0: node1), with
// workers parallel requests. The namespaces are created as needed.
func Populate(ctx context.Context, cs kubernetes.Interface, from, to, eps, nodes, workers int) error {
	for i := 0; i < Namespaces; i++ {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: nsName(i)}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("namespace %s: %w", nsName(i), err)
		}
	}
	var next atomic.Int64
	next.Store(int64(from))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= to || ctx.Err() != nil {
					return
				}
				if err := CreateService(ctx, cs, Ref(i), i, eps, nodes); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func nsName(i int) string { return fmt.Sprintf("load-%d", i) }

// Ref is the i-th generated Service.
func Ref(i int) ServiceRef {
	return ServiceRef{Namespace: nsName(i % Namespaces), Name: fmt.Sprintf("svc-%d", i)}
}

// CreateService creates one Service and its EndpointSlice (seed i picks the
// endpoint addresses).
func CreateService(ctx context.Context, cs kubernetes.Interface, r ServiceRef, i, eps, nodes int) error {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := cs.CoreV1().Services(r.Namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("service %s/%s: %w", r.Namespace, r.Name, err)
	}
	if _, err := cs.DiscoveryV1().EndpointSlices(r.Namespace).Create(ctx, Slice(r, i, eps, nodes), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("endpointslice of %s/%s: %w", r.Namespace, r.Name, err)
	}
	return nil
}

// Slice is the EndpointSlice of Service r with eps ready endpoints.
func Slice(r ServiceRef, i, eps, nodes int) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: r.Name + "-a", Namespace: r.Namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: r.Name, discoveryv1.LabelManagedBy: "clusterload"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)}},
	}
	for j := 0; j < eps; j++ {
		k := i*8 + j // up to 8 endpoints per Service without overlap
		node := "node1"
		if nodes > 0 {
			node = fmt.Sprintf("node-%d", k%nodes)
		}
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 64+k/62500%64, k/250%250, k%250+1)},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(node),
		})
	}
	return s
}

// Churn makes perMinute changes a minute until ctx ends, in turn: create a
// new Service (index from next), rescale an existing one (its slice gets
// another endpoint count), delete the Service created longest ago by the
// churn. It returns the counts when ctx ends.
func Churn(ctx context.Context, cs kubernetes.Interface, perMinute, next, existing, eps, nodes int) (created, rescaled, deleted int, err error) {
	t := time.NewTicker(time.Minute / time.Duration(perMinute))
	defer t.Stop()
	var mine []int
	for step := 0; ; step++ {
		select {
		case <-ctx.Done():
			return created, rescaled, deleted, nil
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		switch step % 3 {
		case 0:
			err = CreateService(rctx, cs, Ref(next), next, eps, nodes)
			mine = append(mine, next)
			next++
			created++
		case 1:
			i := (step * 7919) % existing
			r := Ref(i)
			n := 1 + (step/3)%eps
			_, err = cs.DiscoveryV1().EndpointSlices(r.Namespace).Update(rctx, Slice(r, i, n, nodes), metav1.UpdateOptions{})
			rescaled++
		case 2:
			if len(mine) == 0 {
				break
			}
			r := Ref(mine[0])
			mine = mine[1:]
			err = cs.CoreV1().Services(r.Namespace).Delete(rctx, r.Name, metav1.DeleteOptions{})
			if err == nil {
				err = cs.DiscoveryV1().EndpointSlices(r.Namespace).Delete(rctx, r.Name+"-a", metav1.DeleteOptions{})
			}
			deleted++
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			return created, rescaled, deleted, fmt.Errorf("churn step %d: %w", step, err)
		}
	}
}

// ClkTck is USER_HZ, the unit of /proc/PID/stat times.
const ClkTck = 100

// CPU is utime+stime and cutime+cstime (waited-for children) of pid, in
// milliseconds.
func CPU(pid int) (own, children float64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	var t [4]int64
	for i := range t { // fields 14-17, counted from field 3
		t[i], _ = strconv.ParseInt(f[11+i], 10, 64)
	}
	return float64(t[0]+t[1]) * 1000 / ClkTck, float64(t[2]+t[3]) * 1000 / ClkTck, nil
}

// StatusMiB is a kB field of /proc/PID/status ("VmRSS:", "VmHWM:",
// "RssAnon:") in MiB.
func StatusMiB(pid int, key string) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, key) {
			kb, _ := strconv.Atoi(strings.Fields(l)[1])
			return float64(kb) / 1024
		}
	}
	return 0
}

// LoadAvg is /proc/loadavg's first three fields.
func LoadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// Metric returns the value of the sample named exactly name (with its
// labels as the exposition writes them) in a Prometheus text body.
func Metric(body, name string) (float64, bool) {
	for _, l := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(l, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}
