// Package deploy holds the Kubernetes manifests (kustomize base and the
// audit and enforce overlays) and the Dockerfile. Its Go code only renders
// them for tests: Render builds an overlay with kustomize as `kubectl
// apply -k` would.
package deploy

import (
	"fmt"
	"path/filepath"
	"runtime"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/resmap"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// Dir is the absolute path of the deploy folder.
func Dir() string {
	_, f, _, _ := runtime.Caller(0)
	return filepath.Dir(f)
}

// Render builds deploy/overlays/<overlay> (or "base") with the default
// (root-only) load restrictions, exactly as `kubectl apply -k` would.
func Render(overlay string) (resmap.ResMap, error) {
	dir := filepath.Join(Dir(), "overlays", overlay)
	if overlay == "base" {
		dir = filepath.Join(Dir(), "base")
	}
	return RenderDir(dir)
}

// RenderDir runs kustomize build on any kustomization directory (an
// overlay of the user's own, in tests).
func RenderDir(dir string) (resmap.ResMap, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	return m, nil
}
