package action

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/clock"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/nftables"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/internal/portmap"
	"github.com/remediate-dev/remediate/policy"
)

// RecreateHostPortPodParams are the bounds of RecreateHostPortPod.
type RecreateHostPortPodParams struct {
	// VerifyTimeout bounds the wait, after the delete, for the
	// controller's replacement pod to be Ready and, when it runs on this
	// node, for its hostPort DNAT to be in portmap's rules. Keep it under
	// actionTimeout (default 50s).
	VerifyTimeout policy.Duration `yaml:"verifyTimeout"`
	// PollInterval between checks (default 2s).
	PollInterval policy.Duration `yaml:"pollInterval"`
}

// SetDefaults sets the defaults of RecreateHostPortPod (registry.Defaulter).
func (p *RecreateHostPortPodParams) SetDefaults() {
	*p = RecreateHostPortPodParams{VerifyTimeout: policy.D(50 * time.Second), PollInterval: policy.D(2 * time.Second)}
}

// Validate implements policy.Validator.
func (p *RecreateHostPortPodParams) Validate() []policy.FieldError {
	var errs []policy.FieldError
	if p.VerifyTimeout.Duration < 10*time.Second || p.VerifyTimeout.Duration > 10*time.Minute {
		errs = append(errs, policy.FieldError{Field: "verifyTimeout", Msg: "must be between 10s and 10m"})
	}
	if p.PollInterval.Duration < 100*time.Millisecond || p.PollInterval.Duration > p.VerifyTimeout.Duration {
		errs = append(errs, policy.FieldError{Field: "pollInterval", Msg: "must be between 100ms and verifyTimeout"})
	}
	return errs
}

func init() {
	Define("RecreateHostPortPod",
		"deletes a controller-owned pod of this node whose hostPort DNAT is missing (HostPorts) so that its controller replaces it and the new sandbox gets portmap's DNAT; never a bare or static pod; waits for the replacement to be Ready and, on this node, for its DNAT",
		newRecreateHostPortPod, Disruptive(), NeedsAPI(), ActsOn(finding.KindPod))
}

type recreateHostPortPod struct {
	p RecreateHostPortPodParams
	n *node.Node
}

func newRecreateHostPortPod(p *RecreateHostPortPodParams, n *node.Node) (Action, error) {
	return &recreateHostPortPod{p: *p, n: n}, nil
}

func (a *recreateHostPortPod) clock() clock.PassiveClock {
	if a.n.Clock != nil {
		return a.n.Clock
	}
	return clock.RealClock{}
}

// resolve reads the pod a HostPorts finding names, live, and
// says why it may not be deleted: not on this node, terminating, replaced
// since the finding (another UID), no hostPort, a static pod's mirror, or
// a bare pod (no controller: deleting it loses it for good).
func (a *recreateHostPortPod) resolve(ctx context.Context, f finding.Finding) (*corev1.Pod, error) {
	if a.n.Kube == nil {
		return nil, finding.Skip("%s", a.n.Why("kubernetes"))
	}
	if f.Subject.Kind != finding.KindPod && f.Subject.Kind != "" {
		return nil, fmt.Errorf("refusing: target %q (kind %q) is no pod", f.Target, f.Subject.Kind)
	}
	ref, err := cluster.ParsePodRef(f.Target)
	if err != nil {
		return nil, fmt.Errorf("refusing: %w", err)
	}
	p, err := a.getPod(ctx, ref.Namespace, ref.Name)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, finding.Skip("pod %s/%s is gone", ref.Namespace, ref.Name)
	}
	if err := a.check(p, f); err != nil {
		return nil, err
	}
	return p, nil
}

// getPod reads one pod by a LIST with a metadata.name field selector: the
// chart grants list and watch on pods, not get. nil when there is none.
func (a *recreateHostPortPod) getPod(ctx context.Context, ns, name string) (*corev1.Pod, error) {
	l, err := a.n.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", name).String()})
	if err != nil {
		return nil, fmt.Errorf("reading pod %s/%s: %w", ns, name, err)
	}
	for i := range l.Items {
		if l.Items[i].Name == name {
			return &l.Items[i], nil
		}
	}
	return nil, nil
}

// check is the pure refusal of resolve.
func (a *recreateHostPortPod) check(p *corev1.Pod, f finding.Finding) error {
	key := p.Namespace + "/" + p.Name
	switch {
	case p.Spec.NodeName != a.n.Name:
		return fmt.Errorf("refusing: pod %s runs on node %q, not this node %q", key, p.Spec.NodeName, a.n.Name)
	case p.DeletionTimestamp != nil:
		return finding.Skip("pod %s is already terminating", key)
	}
	if sp := f.Subject.Pod; sp != nil && sp.UID != "" && sp.UID != string(p.UID) {
		return finding.Skip("pod %s is uid %s now, not the pod (uid %s) the finding judged: replaced since", key, p.UID, sp.UID)
	}
	if len(hostPortsOf(p)) == 0 {
		return fmt.Errorf("refusing: pod %s has no container port with a hostPort", key)
	}
	if _, mirror := p.Annotations[cluster.MirrorAnnotation]; mirror {
		return fmt.Errorf("refusing: pod %s is a static pod's mirror: deleting it does not recreate its sandbox (move the manifest out of the kubelet's staticPodPath and back)", key)
	}
	c := metav1.GetControllerOf(p)
	if c == nil {
		return fmt.Errorf("refusing: pod %s is a bare pod (no controller): deleting it would remove it for good; recreate it from its manifest", key)
	}
	if c.Kind == "Node" {
		return fmt.Errorf("refusing: pod %s is owned by its Node (a static pod's mirror)", key)
	}
	return nil
}

// hostPortsOf are the pod's container ports with a hostPort.
func hostPortsOf(p *corev1.Pod) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.HostPort != 0 {
				if cp.Protocol == "" {
					cp.Protocol = corev1.ProtocolTCP
				}
				out = append(out, cp)
			}
		}
	}
	return out
}

func (a *recreateHostPortPod) Plan(ctx context.Context, f finding.Finding) (Plan, error) {
	p, err := a.resolve(ctx, f)
	if err != nil {
		return Plan{}, err
	}
	c := metav1.GetControllerOf(p)
	return Plan{
		Summary: fmt.Sprintf("delete pod %s/%s (uid %s, %s %s) on node %s so that its controller recreates it with a new sandbox, and wait up to %s for the replacement Ready and its hostPort DNAT",
			p.Namespace, p.Name, p.UID, c.Kind, c.Name, a.n.Name, a.p.VerifyTimeout.Duration),
		Details: map[string]any{"namespace": p.Namespace, "pod": p.Name, "uid": string(p.UID), "controllerKind": c.Kind, "controllerName": c.Name,
			"hostPorts": portNames(hostPortsOf(p)), "podIPs": podIPs(p)},
	}, nil
}

func portNames(ps []corev1.ContainerPort) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		s := fmt.Sprintf("%d/%s->%d", p.HostPort, p.Protocol, p.ContainerPort)
		if p.HostIP != "" {
			s = p.HostIP + ":" + s
		}
		out = append(out, s)
	}
	return out
}

func podIPs(p *corev1.Pod) []string {
	var out []string
	for _, ip := range p.Status.PodIPs {
		out = append(out, ip.IP)
	}
	if len(out) == 0 && p.Status.PodIP != "" {
		out = []string{p.Status.PodIP}
	}
	return out
}

func (a *recreateHostPortPod) Execute(ctx context.Context, f finding.Finding) (Result, error) {
	pod, err := a.resolve(ctx, f) // re-check right before acting
	if err != nil {
		return Result{}, err
	}
	uid, owner := pod.UID, metav1.GetControllerOf(pod)
	start := a.clock().Now()
	err = a.n.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return Result{}, fmt.Errorf("deleting pod %s/%s (uid %s): %w", pod.Namespace, pod.Name, uid, err)
	}
	details := map[string]any{"namespace": pod.Namespace, "oldPod": pod.Name, "oldUID": string(uid), "controllerKind": owner.Kind, "controllerName": owner.Name}
	wctx, cancel := context.WithTimeout(ctx, a.p.VerifyTimeout.Duration)
	defer cancel()
	tick := time.NewTicker(a.p.PollInterval.Duration)
	defer tick.Stop()
	// The replacement is a pod of the same controller (a Deployment's
	// ReplicaSet, a StatefulSet, a DaemonSet), on any node.
	p, last := waitReplacement(wctx, tick.C, func(ctx context.Context) ([]corev1.Pod, error) {
		l, err := a.n.Kube.CoreV1().Pods(pod.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var same []corev1.Pod
		for _, q := range l.Items {
			if c := metav1.GetControllerOf(&q); c != nil && c.UID == owner.UID {
				same = append(same, q)
			}
		}
		return same, nil
	}, uid)
	if p == nil {
		return Result{Summary: "pod deleted, replacement not Ready", Details: details},
			fmt.Errorf("deleted pod %s/%s but no Ready replacement of %s %s within %s: %s", pod.Namespace, pod.Name, owner.Kind, owner.Name, a.p.VerifyTimeout.Duration, last)
	}
	details["newPod"], details["newUID"], details["newNode"] = p.Name, string(p.UID), p.Spec.NodeName
	details["readyAfter"] = a.clock().Since(start).Round(time.Millisecond).String()
	summary := fmt.Sprintf("deleted pod %s/%s; replacement %s Ready after %s", pod.Namespace, pod.Name, p.Name, details["readyAfter"])
	if p.Spec.NodeName != a.n.Name {
		details["dnatCheck"] = "not checked: the replacement runs on node " + p.Spec.NodeName
		return Result{Summary: summary + " on node " + p.Spec.NodeName, Details: details}, nil
	}
	missing, err := a.waitDNAT(wctx, tick, p)
	if err != nil {
		details["dnatMissing"] = missing
		return Result{Summary: summary + "; hostPort DNAT not back", Details: details}, err
	}
	details["dnatBackAfter"] = a.clock().Since(start).Round(time.Millisecond).String()
	return Result{Summary: fmt.Sprintf("%s; its hostPort DNAT (%s) back after %s", summary, strings.Join(portNames(hostPortsOf(p)), ", "), details["dnatBackAfter"]), Details: details}, nil
}

// waitDNAT polls portmap's rules until every hostPort of p has its DNAT
// in every family of its IPs, and returns what is still missing when ctx
// ends first.
func (a *recreateHostPortPod) waitDNAT(ctx context.Context, t *time.Ticker, p *corev1.Pod) ([]string, error) {
	if a.n.IPTables == nil && a.n.NFTables == nil {
		return nil, fmt.Errorf("cannot verify the DNAT: %s", a.n.Why("iptables"))
	}
	for {
		missing := a.missingDNAT(ctx, p)
		if len(missing) == 0 {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return missing, fmt.Errorf("replacement %s/%s is Ready but its hostPort DNAT is not in portmap's rules within %s: missing %s",
				p.Namespace, p.Name, a.p.VerifyTimeout.Duration, strings.Join(missing, ", "))
		case <-t.C:
		}
		if q, err := a.getPod(ctx, p.Namespace, p.Name); err == nil && q != nil && q.UID == p.UID {
			p = q // its IPs, as reported now
		}
	}
}

// missingDNAT reads portmap's rules (both backends' saves, never the
// xtables lock; portmap's nftables table) and names the hostPort
// mappings of p without their DNAT; a family that could not be read
// counts as missing (not verified).
func (a *recreateHostPortPod) missingDNAT(ctx context.Context, p *corev1.Pod) []string {
	ips := podIPs(p)
	if len(ips) == 0 {
		return []string{"no pod IP yet"}
	}
	var dnats []portmap.DNAT
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		if a.n.IPTables != nil {
			for _, be := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
				s, err := a.n.IPTables.Save(ctx, fam, be)
				if err == nil && s != nil {
					d, _ := portmap.FromIPTables(s.Rules, fam, "iptables-"+string(be))
					dnats = append(dnats, d...)
				}
			}
		}
		if a.n.NFTables != nil {
			s, err := a.n.NFTables.ListTable(ctx, portmap.NFTFamily(fam), portmap.NFTTable)
			if err == nil && s != nil && s.Ruleset != nil {
				dnats = append(dnats, portmap.FromNFT(s.Ruleset.Table(portmap.NFTFamily(fam), portmap.NFTTable), fam)...)
			} else if err != nil && !errors.Is(err, nftables.ErrNoTable) && !errors.Is(err, nftables.ErrUnavailable) {
				continue
			}
		}
	}
	var missing []string
	for _, hp := range hostPortsOf(p) {
		for _, ip := range ips {
			fam := iptables.IPv4
			if strings.Contains(ip, ":") {
				fam = iptables.IPv6
			}
			hostIP := hp.HostIP
			if hostIP == "0.0.0.0" || hostIP == "::" {
				hostIP = ""
			}
			if hostIP != "" && strings.Contains(hostIP, ":") != (fam == iptables.IPv6) {
				continue
			}
			if !portmap.Has(dnats, fam, string(hp.Protocol), hp.HostPort, hostIP, ip, hp.ContainerPort) {
				missing = append(missing, fmt.Sprintf("%s %d/%s -> %s:%d", fam, hp.HostPort, hp.Protocol, ip, hp.ContainerPort))
			}
		}
	}
	return missing
}
