package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"time"
)

// kubeProxyConfig is the lane's kube-proxy configuration, the DaemonSet's
// and the static pod's (KubeProxyStaticPod).
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: 10.244.0.0/16
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0}
clientConnection: {kubeconfig: /var/lib/kube-proxy/kubeconfig.conf}
`

// kubeProxyToken is the static pod kube-proxy's bearer token (user
// system:kube-proxy).
const kubeProxyToken = "kubeproxytoken"

// KubeProxyStaticPodName is the static kube-proxy's name in its manifest;
// its mirror pod is named KubeProxyStaticPodName-NodeName.
const KubeProxyStaticPodName = "kube-proxy"

// KubeProxyStaticPod writes what kube-proxy needs to run as a static pod
// (RKE2's and kubeadm-era clusters' shape) to the node's folder, its
// configuration as the DaemonSet's (kubeProxyConfig) and a kubeconfig
// with the token of user system:kube-proxy (a static pod can mount no
// ServiceAccount token nor ConfigMap), and returns its manifest: the
// DaemonSet's pod spec with hostPath volumes, in kube-system, labelled
// k8s-app=kube-proxy. The caller writes the manifest to StaticPodDir
// (the kubelet then runs it) and removes it to stop it; the DaemonSet's
// pod must not run on the node meanwhile (both bind kube-proxy's ports).
func (n *Node) KubeProxyStaticPod() ([]byte, error) {
	dir := n.path("kube-proxy-static")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(n.path("pki", "ca.crt"))
	if err != nil {
		return nil, err
	}
	files := map[string]string{
		"ca.crt":      string(ca),
		"config.conf": kubeProxyConfig,
		"kubeconfig.conf": fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: default
  cluster: {server: %s, certificate-authority: /var/lib/kube-proxy/ca.crt}
users:
- name: default
  user: {token: %s}
contexts:
- name: default
  context: {cluster: default, namespace: default, user: default}
current-context: default
`, apiURL, kubeProxyToken),
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			return nil, err
		}
	}
	hostPath := func(name, path string, t corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &t}}}
	}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: KubeProxyStaticPodName, Namespace: "kube-system", Labels: map[string]string{"k8s-app": "kube-proxy"}},
		Spec: corev1.PodSpec{
			HostNetwork: true, PriorityClassName: "system-node-critical", TerminationGracePeriodSeconds: ptr.To[int64](2),
			Containers: []corev1.Container{{
				Name: "kube-proxy", Image: KubeProxyImage, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=" + NodeName},
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
				VolumeMounts: []corev1.VolumeMount{{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy", ReadOnly: true},
					{Name: "xtables-lock", MountPath: "/run/xtables.lock"}, {Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{
				hostPath("kube-proxy", dir, corev1.HostPathDirectory),
				hostPath("xtables-lock", n.XtablesLock, corev1.HostPathFileOrCreate),
				hostPath("lib-modules", "/lib/modules", corev1.HostPathUnset),
			},
		},
	}
	return json.Marshal(pod)
}

// deployKubeProxy runs kube-proxy (iptables mode) as kubeadm does: a
// DaemonSet in kube-system, hostNetwork, privileged, with a kubeconfig
// pointing at the node address (the Service IP is not routable until
// kube-proxy itself has run), and waits for its pod to be Ready.
func (n *Node) deployKubeProxy(ctx context.Context) error {
	c := n.Client
	ns := "kube-system"
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy"}}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kube-proxy ServiceAccount: %w", err)
	}
	if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:node-proxier"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:node-proxier"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "kube-proxy", Namespace: ns}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kube-proxy ClusterRoleBinding: %w", err)
	}
	sa := "/var/run/secrets/kubernetes.io/serviceaccount"
	if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy"},
		Data: map[string]string{
			"kubeconfig.conf": fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: default
  cluster: {server: %s, certificate-authority: %s/ca.crt}
users:
- name: default
  user: {tokenFile: %s/token}
contexts:
- name: default
  context: {cluster: default, namespace: default, user: default}
current-context: default
`, apiURL, sa, sa),
			"config.conf": kubeProxyConfig,
		},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kube-proxy ConfigMap: %w", err)
	}
	labels := map[string]string{"k8s-app": "kube-proxy"}
	hostPath := func(name, path string, t corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &t}}}
	}
	ds := &appsv1.DaemonSet{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-proxy", Labels: labels},
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					ServiceAccountName: "kube-proxy", HostNetwork: true, PriorityClassName: "system-node-critical",
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "kube-proxy", Image: KubeProxyImage, ImagePullPolicy: corev1.PullNever,
						Command:         []string{"/usr/local/bin/kube-proxy", "--config=/var/lib/kube-proxy/config.conf", "--hostname-override=$(NODE_NAME)"},
						Env:             []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts: []corev1.VolumeMount{{Name: "kube-proxy", MountPath: "/var/lib/kube-proxy"},
							{Name: "xtables-lock", MountPath: "/run/xtables.lock"}, {Name: "lib-modules", MountPath: "/lib/modules", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{
						{Name: "kube-proxy", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-proxy"}}}},
						hostPath("xtables-lock", n.XtablesLock, corev1.HostPathFileOrCreate),
						hostPath("lib-modules", "/lib/modules", corev1.HostPathUnset),
					},
				},
			},
		},
	}
	if _, err := c.AppsV1().DaemonSets(ns).Create(ctx, ds, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("kube-proxy DaemonSet: %w", err)
	}
	return n.poll(ctx, "kube-proxy pod Ready", 3*time.Minute, func(ctx context.Context) (bool, string) {
		return n.PodsReady(ctx, ns, "k8s-app=kube-proxy")
	}, "kubelet")
}

// PodsReady reports whether the selected pods exist and are all Ready, and
// a one-line summary of each (phase, reasons of waiting containers).
func (n *Node) PodsReady(ctx context.Context, ns, selector string) (bool, string) {
	pods, err := n.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return false, err.Error()
	}
	if len(pods.Items) == 0 {
		return false, "no pod " + selector
	}
	all, msg := true, ""
	for _, p := range pods.Items {
		ready := false
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				ready = true
			}
		}
		all = all && ready && p.DeletionTimestamp == nil
		msg += fmt.Sprintf("%s %s ready=%v", p.Name, p.Status.Phase, ready)
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Waiting != nil {
				msg += fmt.Sprintf(" %s:%s(%s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
			}
		}
		msg += "; "
	}
	return all, msg
}
