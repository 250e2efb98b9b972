// Command mkimage packs container images without a container engine or a
// registry: a base root filesystem tar (tools/image/rootfs.sh) as the first
// layer and the files named by -file as a second, with the image's
// entrypoint, user, environment and labels, written as a docker-archive
// tarball (what `docker load` and `ctr images import` read).
//
//	mkimage -base rootfs.tar -file bin/remediate-linux-amd64:/usr/local/bin/remediate:0755 \
//	  -entrypoint /usr/local/bin/remediate -user 0:0 -name ghcr.io/remediate-dev/remediate:0.1.0 \
//	  -arch amd64 -out image.tar
//
// -spec FILE reads the entrypoint, user, labels and files from a JSON
// spec (tools/image/image.json; {arch} in a source path becomes -arch, and
// relative source paths are under -srcdir).
// Without -base the image has only the -file layer (a static program such
// as the test lane's pause).
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Spec is the JSON form of the image's metadata and files (-spec).
type Spec struct {
	Entrypoint []string          `json:"entrypoint"`
	User       string            `json:"user"`
	Labels     map[string]string `json:"labels"`
	Files      []File            `json:"files"`
}

// File is one file of the top layer.
type File struct {
	// Src is the path on this machine ({arch} is replaced by -arch).
	Src string `json:"src"`
	// Dst is the absolute path in the image.
	Dst string `json:"dst"`
	// Mode is the octal permission ("0755").
	Mode string `json:"mode"`
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run() error {
	var files, labels multi
	base := flag.String("base", "", "uncompressed tar of the base root filesystem (first layer)")
	specPath := flag.String("spec", "", "JSON spec: entrypoint, user, labels, files")
	ref := flag.String("name", "", "image reference, e.g. ghcr.io/remediate-dev/remediate:0.1.0")
	entry := flag.String("entrypoint", "", "comma-separated ENTRYPOINT (overrides the spec's)")
	cmd := flag.String("cmd", "", "comma-separated CMD")
	user := flag.String("user", "", "USER (overrides the spec's)")
	arch := flag.String("arch", "amd64", "image architecture (linux/ARCH)")
	out := flag.String("out", "", "output docker-archive tarball")
	srcDir := flag.String("srcdir", ".", "folder the spec's relative source paths are in")
	flag.Var(&files, "file", "SRC:DST[:MODE] added to the top layer (repeatable)")
	flag.Var(&labels, "label", "KEY=VALUE label (repeatable)")
	flag.Parse()
	if *ref == "" || *out == "" {
		return fmt.Errorf("-name and -out are required")
	}
	var spec Spec
	if *specPath != "" {
		b, err := os.ReadFile(*specPath)
		if err != nil {
			return fmt.Errorf("read spec: %w", err)
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			return fmt.Errorf("parse spec %s: %w", *specPath, err)
		}
	}
	for i := range spec.Files {
		spec.Files[i].Src = strings.ReplaceAll(spec.Files[i].Src, "{arch}", *arch)
		if !filepath.IsAbs(spec.Files[i].Src) {
			spec.Files[i].Src = filepath.Join(*srcDir, spec.Files[i].Src)
		}
	}
	for _, f := range files {
		parts := strings.Split(f, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("-file %q: want SRC:DST[:MODE]", f)
		}
		fl := File{Src: parts[0], Dst: parts[1], Mode: "0755"}
		if len(parts) == 3 {
			fl.Mode = parts[2]
		}
		spec.Files = append(spec.Files, fl)
	}
	if *entry != "" {
		spec.Entrypoint = strings.Split(*entry, ",")
	}
	if *user != "" {
		spec.User = *user
	}
	if spec.Labels == nil {
		spec.Labels = map[string]string{}
	}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		spec.Labels[k] = v
	}

	img := empty.Image
	if *base != "" {
		layer, err := tarball.LayerFromFile(*base)
		if err != nil {
			return fmt.Errorf("base layer %s: %w", *base, err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return fmt.Errorf("append base layer: %w", err)
		}
	}
	if len(spec.Files) > 0 {
		b, err := filesTar(spec.Files)
		if err != nil {
			return err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(b)), nil
		})
		if err != nil {
			return fmt.Errorf("files layer: %w", err)
		}
		if img, err = mutate.AppendLayers(img, layer); err != nil {
			return fmt.Errorf("append files layer: %w", err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", *arch
	cf.Config = v1.Config{
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Entrypoint: spec.Entrypoint,
		User:       spec.User,
		Labels:     spec.Labels,
	}
	if *cmd != "" {
		cf.Config.Cmd = strings.Split(*cmd, ",")
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	tag, err := name.NewTag(*ref)
	if err != nil {
		return fmt.Errorf("image name %q: %w", *ref, err)
	}
	if err := tarball.WriteToFile(*out, tag, img); err != nil {
		return fmt.Errorf("write %s: %w", *out, err)
	}
	return nil
}

// filesTar returns a tar of files with their parent directories, owned by
// root, with a fixed modification time (the layer's digest depends only on
// the files' contents and modes).
func filesTar(files []File) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Unix(0, 0)
	dirs := map[string]bool{}
	var dirList []string
	for _, f := range files {
		if !path.IsAbs(f.Dst) {
			return nil, fmt.Errorf("file %s: destination %q is not absolute", f.Src, f.Dst)
		}
		for d := path.Dir(f.Dst); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			dirList = append(dirList, d)
		}
	}
	sort.Strings(dirList)
	for _, d := range dirList {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/",
			Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", f.Src, err)
		}
		mode, err := strconv.ParseInt(f.Mode, 8, 32)
		if err != nil {
			return nil, fmt.Errorf("file %s: mode %q: %w", f.Src, f.Mode, err)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"),
			Mode: mode, Size: int64(len(b)), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
