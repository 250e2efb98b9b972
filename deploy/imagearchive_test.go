package deploy

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The image archives `make image` writes (bin/remediate-image-linux-ARCH.tar,
// or REMEDIATE_IMAGE_DIR's), checked by TestImageArchives. An archive that
// is not there is skipped (said so) unless its arch is in
// REMEDIATE_IMAGE_ARCHIVES (space-separated: "asked for", then it must be
// there): the arm64 archive needs the arm64 rootfs, minutes to build cold
// under emulation (docs/NODE-LANE.md), and `make test` does not build it.
func imageArchivePath(t *testing.T, arch string) string {
	dir := os.Getenv("REMEDIATE_IMAGE_DIR")
	if dir == "" {
		dir = filepath.Join(Dir(), "..", "bin")
	}
	return filepath.Join(dir, "remediate-image-linux-"+arch+".tar")
}

// elfMachine is the ELF machine of each image architecture.
var elfMachine = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// qemuUser is the qemu-user program (Debian's qemu-user-static) that runs
// a foreign architecture's programs on this machine.
var qemuUser = map[string]string{"arm64": "qemu-aarch64-static"}

// TestImageArchives opens each image archive of the Makefile's
// IMAGE_ARCHIVE_ARCHES and checks that it is that architecture's image:
// the config says linux/ARCH with the Dockerfile's entrypoint; the top
// layer's /usr/local/bin/remediate is a static ELF of ARCH's machine; and,
// as root, with the layers unpacked into a folder and chrooted into it,
// `remediate --version` and the image's own `iptables --version` (its
// Debian arm64 libraries, not the host's) run: natively for amd64, under
// qemu-user (the static emulator copied into the folder, not the host's
// binfmt_misc) for a foreign arch.
func TestImageArchives(t *testing.T) {
	mk, err := os.ReadFile(filepath.Join(Dir(), "..", "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^IMAGE_ARCHIVE_ARCHES \?= (.+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no IMAGE_ARCHIVE_ARCHES")
	}
	asked := strings.Fields(os.Getenv("REMEDIATE_IMAGE_ARCHIVES"))
	for _, arch := range strings.Fields(string(m[1])) {
		t.Run(arch, func(t *testing.T) {
			path := imageArchivePath(t, arch)
			if _, err := os.Stat(path); err != nil {
				for _, a := range asked {
					if a == arch {
						t.Fatalf("REMEDIATE_IMAGE_ARCHIVES asks for %s: %v (make image)", arch, err)
					}
				}
				t.Skipf("%s: %v (make image builds it; REMEDIATE_IMAGE_ARCHIVES=%s makes it required)", arch, err, arch)
			}
			checkImageArchive(t, path, arch)
		})
	}
}

func checkImageArchive(t *testing.T, path, arch string) {
	files, err := readTar(path)
	if err != nil {
		t.Fatal(err)
	}
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(files["manifest.json"], &manifest); err != nil || len(manifest) != 1 {
		t.Fatalf("%s: manifest.json: %v (%d images)", path, err, len(manifest))
	}
	var cfg struct {
		OS           string `json:"os"`
		Architecture string `json:"architecture"`
		Config       struct {
			Entrypoint []string
			User       string
		} `json:"config"`
	}
	if err := json.Unmarshal(files[manifest[0].Config], &cfg); err != nil {
		t.Fatalf("%s: config %s: %v", path, manifest[0].Config, err)
	}
	if cfg.OS != "linux" || cfg.Architecture != arch {
		t.Errorf("%s: config says %s/%s, want linux/%s", path, cfg.OS, cfg.Architecture, arch)
	}
	if strings.Join(cfg.Config.Entrypoint, " ") != "/usr/local/bin/remediate" || cfg.Config.User != "0:0" {
		t.Errorf("%s: entrypoint %q user %q", path, cfg.Config.Entrypoint, cfg.Config.User)
	}
	if len(manifest[0].Layers) != 2 {
		t.Fatalf("%s: %d layers, want 2 (the Debian rootfs, then the binary and the SBOM)", path, len(manifest[0].Layers))
	}
	top, err := layerFiles(files[manifest[0].Layers[1]])
	if err != nil {
		t.Fatalf("%s: top layer: %v", path, err)
	}
	bin := top["usr/local/bin/remediate"]
	ef, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("%s: /usr/local/bin/remediate (%d bytes) is not an ELF: %v", path, len(bin), err)
	}
	if ef.Machine != elfMachine[arch] || ef.Class != elf.ELFCLASS64 {
		t.Errorf("%s: /usr/local/bin/remediate is %s %s, want %s", path, ef.Class, ef.Machine, elfMachine[arch])
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s: /usr/local/bin/remediate is dynamically linked (PT_INTERP): the image's binary is static", path)
		}
	}
	if len(top["usr/share/doc/remediate/sbom.spdx.json"]) == 0 {
		t.Errorf("%s: no SBOM at /usr/share/doc/remediate/sbom.spdx.json", path)
	}
	t.Logf("%s: linux/%s, remediate %s %s (%d bytes)", filepath.Base(path), cfg.Architecture, ef.Class, ef.Machine, len(bin))

	// Run it in the unpacked rootfs.
	if os.Getuid() != 0 {
		t.Skip("running the image's programs needs root (chroot)")
	}
	root := t.TempDir()
	for _, l := range manifest[0].Layers {
		if err := unpackLayer(files[l], root); err != nil {
			t.Fatalf("%s: unpack layer %s: %v", path, l, err)
		}
	}
	var prefix []string
	if q := qemuUser[arch]; q != "" {
		host, err := exec.LookPath(q)
		if err != nil {
			t.Fatalf("%s: the %s image's programs run here under %s (Debian qemu-user-static, tools/hostdeps/packages.txt): %v", path, arch, q, err)
		}
		b, err := os.ReadFile(host)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, q), b, 0o755); err != nil {
			t.Fatal(err)
		}
		prefix = []string{"/" + q}
	}
	// --version of each program. Under qemu-user the netfilter netlink
	// family is not emulated (qemu 7.2: socket(AF_NETLINK, NETLINK_NETFILTER)
	// gives EPROTONOSUPPORT), and iptables-nft, nft and conntrack open such
	// a socket before printing their version: for a foreign arch the
	// legacy iptables (the same xtables code, no netlink) prints it, and
	// the others are checked by the image's own dynamic loader resolving
	// every library they need from the image (ld.so --list, no "not found").
	type check struct {
		args []string
		want string
	}
	checks := []check{{[]string{"/usr/local/bin/remediate", "--version"}, "remediate "},
		{[]string{"/usr/sbin/iptables-legacy", "--version"}, "iptables v1.8"}}
	netlink := []check{{[]string{"/usr/sbin/iptables", "--version"}, "iptables v1.8"},
		{[]string{"/usr/sbin/nft", "--version"}, "nftables v1."},
		{[]string{"/usr/sbin/conntrack", "--version"}, "conntrack v1."}}
	if len(prefix) == 0 {
		checks = append(checks, netlink...)
	}
	for _, c := range checks {
		out, err := chrootRun(root, append(prefix, c.args...))
		if line, _, _ := strings.Cut(out, "\n"); err != nil || !strings.HasPrefix(line, c.want) {
			t.Errorf("%s: %s in the unpacked image: %v: %q, want %q...", path, strings.Join(append(prefix, c.args...), " "), err, out, c.want)
			continue
		}
		t.Logf("%s: %s", strings.Join(c.args, " "), strings.TrimSpace(out))
	}
	for _, c := range netlink {
		args := append(append(prefix, ldso[arch], "--list"), c.args[0])
		out, err := chrootRun(root, args)
		if err != nil || strings.Contains(out, "not found") || !strings.Contains(out, "libc.so.6 => ") {
			t.Errorf("%s: %s in the unpacked image: %v:\n%s", path, strings.Join(args, " "), err, out)
			continue
		}
		t.Logf("%s: %d libraries, all in the image", strings.Join(args[len(prefix):], " "), strings.Count(out, " => "))
	}
}

// ldso is the dynamic loader of Debian's programs for each architecture.
var ldso = map[string]string{"amd64": "/lib64/ld-linux-x86-64.so.2", "arm64": "/lib/ld-linux-aarch64.so.1"}

// chrootRun runs args with root as its root directory (bounded: 2 minutes,
// qemu-user on a loaded machine) and returns its output.
func chrootRun(root string, args []string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// readTar returns the regular files of a tar by name.
func readTar(path string) (map[string][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(bufio.NewReader(f))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, h.Name, err)
		}
		out[h.Name] = b
	}
}

// layerReader opens a layer blob, gzip-compressed or not.
func layerReader(b []byte) (*tar.Reader, error) {
	if len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b {
		z, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		return tar.NewReader(z), nil
	}
	return tar.NewReader(bytes.NewReader(b)), nil
}

// layerFiles returns a layer's regular files by path (no leading slash).
func layerFiles(b []byte) (map[string][]byte, error) {
	tr, err := layerReader(b)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if out[strings.TrimPrefix(filepath.Clean("/"+h.Name), "/")], err = io.ReadAll(tr); err != nil {
				return nil, err
			}
		}
	}
}

// unpackLayer writes a layer's directories, files, symlinks and hard links
// under root (device nodes and the like are skipped: no program run here
// needs them). Names are cleaned under root; a symlink's target is kept
// as is (it resolves inside the chroot).
func unpackLayer(b []byte, root string) error {
	tr, err := layerReader(b)
	if err != nil {
		return err
	}
	if root, err = filepath.EvalSymlinks(root); err != nil {
		return err
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Join(root, filepath.Clean("/"+h.Name))
		if name == root {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		// Never through a symlink out of root (this runs as root).
		if dir, err := filepath.EvalSymlinks(filepath.Dir(name)); err != nil || (dir != root && !strings.HasPrefix(dir, root+"/")) {
			return fmt.Errorf("%s: its folder resolves to %q (%v), outside %s", h.Name, dir, err, root)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			_ = os.Remove(name)
			f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.Remove(name)
			if err := os.Symlink(h.Linkname, name); err != nil {
				return err
			}
		case tar.TypeLink:
			_ = os.Remove(name)
			if err := os.Link(filepath.Join(root, filepath.Clean("/"+h.Linkname)), name); err != nil {
				return err
			}
		}
	}
}
