package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/kustomize/api/resmap"
)

// ChartDir is the absolute path of the Helm chart.
func ChartDir() string { return filepath.Join(Dir(), "helm", "remediate") }

// ErrNoHelm means no helm binary was found (see HelmBin).
var ErrNoHelm = errors.New("helm not found: run `make helm-bin` (builds the pinned helm into _output/bin) or set REMEDIATE_HELM")

// HelmBin returns the helm binary to use: $REMEDIATE_HELM, else the one
// `make helm-bin` builds into <repo>/_output/bin, else helm on PATH.
func HelmBin() (string, error) {
	if p := os.Getenv("REMEDIATE_HELM"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("REMEDIATE_HELM: %w", err)
		}
		return p, nil
	}
	if p := filepath.Join(Dir(), "..", "_output", "bin", "helm"); fileExists(p) {
		return p, nil
	}
	if p, err := exec.LookPath("helm"); err == nil {
		return p, nil
	}
	return "", ErrNoHelm
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// Helm runs helm with args under a 2-minute deadline and an isolated
// configuration (no user repositories or plugins), returning stdout; the
// error carries stderr.
func Helm(ctx context.Context, helm string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	home, err := os.MkdirTemp("", "remediate-helm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(home)
	cmd := exec.CommandContext(ctx, helm, args...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home+"/config", "HELM_CACHE_HOME="+home+"/cache",
		"HELM_DATA_HOME="+home+"/data", "KUBECONFIG="+home+"/none")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.Bytes(), nil
}

// RenderChart runs `helm template` on the chart as release "remediate" in
// namespace with the given extra arguments (--set k=v, -f file) and
// returns its objects in order, hooks included.
func RenderChart(ctx context.Context, helm, namespace string, args ...string) ([]*unstructured.Unstructured, error) {
	a := append([]string{"template", "remediate", ChartDir(), "--namespace", namespace}, args...)
	out, err := Helm(ctx, helm, a...)
	if err != nil {
		return nil, err
	}
	return DecodeObjects(out)
}

// DecodeObjects splits a multi-document YAML stream into objects, skipping
// empty documents.
func DecodeObjects(y []byte) ([]*unstructured.Unstructured, error) {
	d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(y), 4096)
	var objs []*unstructured.Unstructured
	for {
		var raw json.RawMessage
		if err := d.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("decode rendered YAML: %w", err)
		}
		if len(bytes.TrimSpace(raw)) == 0 || string(raw) == "null" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("decode rendered object: %w", err)
		}
		objs = append(objs, u)
	}
}

// KustomizeObjects converts a kustomize result to objects.
func KustomizeObjects(m resmap.ResMap) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, r := range m.Resources() {
		js, err := r.MarshalJSON()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(js); err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		objs = append(objs, u)
	}
	return objs, nil
}

// ChartNamespace is the namespace the comparisons render the chart into:
// the one deploy/base puts remediate in (deploy/base/namespace.yaml).
const ChartNamespace = "remediate"

// ChartOnly lists the installed chart objects deploy/base does not have
// (rendered into ChartNamespace). None now: the fleet controls' RBAC is in
// both, and compared.
var ChartOnly = map[string]bool{}

// KustomizeOnly lists the objects of the overlays the chart does not
// render: the Namespace. Helm's convention is that the release namespace
// exists before the release (`helm install -n remediate
// --create-namespace`); a chart that also created it would fail on an
// existing namespace and delete it, with everything in it, on uninstall.
var KustomizeOnly = map[string]bool{
	"Namespace /remediate": true,
}

// IsHook reports whether o is a Helm hook (not part of the installed
// release: run around install, upgrade or uninstall).
func IsHook(o *unstructured.Unstructured) bool {
	_, ok := o.GetAnnotations()["helm.sh/hook"]
	return ok
}

// ObjectKey names an object: Kind namespace/name.
func ObjectKey(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// helmOnlyLabels are the labels Helm conventions add that the kustomize base
// does not carry; Normalize drops them.
var helmOnlyLabels = []string{"app.kubernetes.io/instance", "app.kubernetes.io/managed-by",
	"app.kubernetes.io/version", "helm.sh/chart"}

// kustomizeHash is the content-hash suffix configMapGenerator appends.
var kustomizeHash = regexp.MustCompile(`-[bcdfghkmt2-9]{10}$`)

// Normalize rewrites o in place so that the chart's and the kustomize base's
// renderings of the same object compare equal: it drops Helm's
// bookkeeping labels (everywhere label maps occur), kustomize's ConfigMap
// hash suffixes, the image tag or digest (the base cannot pin a version;
// the chart must), whitespace runs in admission CEL expressions and the
// order of a pod's volumes and volumeMounts (sorted by name: kustomize's
// strategic merge patch moves the items it touches to the front, and the
// order carries no meaning: volumes are a set keyed by name, and the
// runtime orders mounts by path depth). Any other difference is real.
func Normalize(o *unstructured.Unstructured) {
	dropLabels := func(path ...string) {
		m, ok, _ := unstructured.NestedStringMap(o.Object, path...)
		if !ok {
			return
		}
		for _, l := range helmOnlyLabels {
			delete(m, l)
		}
		if len(m) == 0 {
			unstructured.RemoveNestedField(o.Object, path...)
			return
		}
		_ = unstructured.SetNestedStringMap(o.Object, m, path...)
	}
	dropLabels("metadata", "labels")
	dropLabels("spec", "selector", "matchLabels")
	dropLabels("spec", "template", "metadata", "labels")
	// CEL is whitespace-insensitive outside string literals, and kyaml
	// (kustomize) and go-yaml (helm) fold `>-` scalars with more-indented
	// lines differently (an extra "\n").
	if o.GetKind() == "ValidatingAdmissionPolicy" {
		for _, f := range []string{"validations", "variables", "matchConditions"} {
			items, ok, _ := unstructured.NestedSlice(o.Object, "spec", f)
			if !ok {
				continue
			}
			for _, it := range items {
				if m, ok := it.(map[string]any); ok {
					if e, ok := m["expression"].(string); ok {
						m["expression"] = strings.Join(strings.Fields(e), " ")
					}
				}
			}
			_ = unstructured.SetNestedSlice(o.Object, items, "spec", f)
		}
	}
	if o.GetKind() == "ConfigMap" {
		o.SetName(kustomizeHash.ReplaceAllString(o.GetName(), ""))
	}
	if vols, ok, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "volumes"); ok {
		for _, v := range vols {
			if cm, ok, _ := unstructured.NestedMap(v.(map[string]any), "configMap"); ok {
				if n, ok := cm["name"].(string); ok {
					cm["name"] = kustomizeHash.ReplaceAllString(n, "")
					_ = unstructured.SetNestedMap(v.(map[string]any), cm, "configMap")
				}
			}
		}
		sortByName(vols)
		_ = unstructured.SetNestedSlice(o.Object, vols, "spec", "template", "spec", "volumes")
	}
	if cs, ok, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers"); ok {
		for _, c := range cs {
			cm := c.(map[string]any)
			if img, ok := cm["image"].(string); ok {
				cm["image"] = ImageRepository(img)
			}
			if vm, ok := cm["volumeMounts"].([]any); ok {
				sortByName(vm)
			}
		}
		_ = unstructured.SetNestedSlice(o.Object, cs, "spec", "template", "spec", "containers")
	}
}

// sortByName sorts a list of objects with a name field (volumes,
// volumeMounts) by it, stably.
func sortByName(items []any) {
	name := func(i int) string {
		m, _ := items[i].(map[string]any)
		n, _ := m["name"].(string)
		return n
	}
	sort.SliceStable(items, func(i, j int) bool { return name(i) < name(j) })
}

// ImageRepository strips the tag and digest from an image reference.
func ImageRepository(img string) string {
	if i := strings.Index(img, "@"); i >= 0 {
		img = img[:i]
	}
	if i := strings.LastIndex(img, ":"); i > strings.LastIndex(img, "/") {
		img = img[:i]
	}
	return img
}

// ByKey indexes objects by ObjectKey and returns the sorted keys.
func ByKey(objs []*unstructured.Unstructured) (map[string]*unstructured.Unstructured, []string) {
	m := map[string]*unstructured.Unstructured{}
	var keys []string
	for _, o := range objs {
		k := ObjectKey(o)
		m[k] = o
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return m, keys
}
