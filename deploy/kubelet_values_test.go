package deploy

import (
	"context"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartKubeletAndCRIOptIns: by default the chart mounts no CRI socket
// and verifies the kubelet's certificate (no flag); host.criSocket mounts
// the socket's directory read-only and points --cri-socket into it,
// kubelet.insecureTLS adds --kubelet-insecure-tls; and the ClusterRole
// grants get nodes/metrics, never nodes/proxy, in both modes.
func TestChartKubeletAndCRIOptIns(t *testing.T) {
	helm := needHelm(t)
	ctx := context.Background()
	type pod struct {
		args    []string
		mounts  map[string]string
		volumes map[string]string
	}
	render := func(t *testing.T, set ...string) (pod, []map[string]any) {
		t.Helper()
		objs, err := RenderChart(ctx, helm, "ops", set...)
		if err != nil {
			t.Fatal(err)
		}
		m, _ := ByKey(objs)
		ds := m["DaemonSet ops/remediate"]
		cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		c := cs[0].(map[string]any)
		p := pod{mounts: map[string]string{}, volumes: map[string]string{}}
		p.args, _, _ = unstructured.NestedStringSlice(c, "args")
		vms, _, _ := unstructured.NestedSlice(c, "volumeMounts")
		for _, v := range vms {
			vm := v.(map[string]any)
			p.mounts[vm["name"].(string)] = vm["mountPath"].(string)
			if vm["name"] == "host-cri" && vm["readOnly"] != true {
				t.Error("the CRI socket's directory is mounted writable")
			}
		}
		vols, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "volumes")
		for _, v := range vols {
			path, _, _ := unstructured.NestedString(v.(map[string]any), "hostPath", "path")
			p.volumes[v.(map[string]any)["name"].(string)] = path
		}
		rules, _, _ := unstructured.NestedSlice(m["ClusterRole /remediate"].Object, "rules")
		var rs []map[string]any
		for _, r := range rules {
			rs = append(rs, r.(map[string]any))
		}
		return p, rs
	}
	has := func(args []string, prefix string) bool {
		return slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, prefix) })
	}
	def, rules := render(t)
	if has(def.args, "--cri-socket") || has(def.args, "--kubelet-insecure-tls") || def.mounts["host-cri"] != "" {
		t.Errorf("defaults: args %v, mounts %v", def.args, def.mounts)
	}
	metrics, proxy := false, false
	for _, r := range rules {
		res, _, _ := unstructured.NestedStringSlice(r, "resources")
		verbs, _, _ := unstructured.NestedStringSlice(r, "verbs")
		if slices.Contains(res, "nodes/metrics") && slices.Equal(verbs, []string{"get"}) {
			metrics = true
		}
		if slices.Contains(res, "nodes/proxy") || slices.Contains(res, "nodes/*") {
			proxy = true
		}
	}
	if !metrics || proxy {
		t.Errorf("ClusterRole: get nodes/metrics %v, nodes/proxy %v", metrics, proxy)
	}
	on, _ := render(t, "--set", "host.criSocket=/run/containerd/containerd.sock", "--set", "kubelet.insecureTLS=true")
	if !slices.Contains(on.args, "--cri-socket=/host/cri/containerd.sock") || !slices.Contains(on.args, "--kubelet-insecure-tls=true") {
		t.Errorf("opt-ins: args %v", on.args)
	}
	if on.mounts["host-cri"] != "/host/cri" || on.volumes["host-cri"] != "/run/containerd" {
		t.Errorf("opt-ins: mounts %v, volumes %v", on.mounts, on.volumes)
	}
	if _, err := RenderChart(ctx, helm, "ops", "--set", "host.criSocket=run/containerd.sock"); err == nil {
		t.Error("a relative criSocket accepted")
	}
}
