package iptables

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Install describes the iptables installed in one root filesystem (the
// host's, seen through /proc/1/root, or a container's, through
// /proc/<pid>/root), read without executing anything: the command's
// symlinks are resolved inside that root, the backend comes from the
// binary's embedded version string or the multi-call binary's name, and the
// version from the embedded string or the package database.
type Install struct {
	// Root is the directory read as "/".
	Root string `json:"root"`
	// Links is the command and each symlink it resolved through, as paths
	// inside Root ("/usr/sbin/iptables", "/etc/alternatives/iptables",
	// "/usr/sbin/iptables-nft", "/usr/sbin/xtables-nft-multi").
	Links []string `json:"links"`
	// Binary is the final file (the last of Links).
	Binary string `json:"binary"`
	// Backend is legacy, nft, or "" when unknown or undecided.
	Backend Backend `json:"backend,omitempty"`
	// BackendSource says where Backend came from: "binary" (its embedded
	// "1.8.9 (nf_tables)"), "name" (xtables-nft-multi, iptables-legacy,
	// ...), "" when unknown.
	BackendSource string `json:"backendSource,omitempty"`
	// Version is iptables' version ("1.8.9"), "" when unknown.
	Version string `json:"version,omitempty"`
	// VersionSource: "binary", "dpkg" (/var/lib/dpkg/status or
	// status.d/), "apk" (/lib/apk/db/installed), "" when unknown.
	VersionSource string `json:"versionSource,omitempty"`
	// Wrapper is true when the command is still kube-proxy's
	// iptables-wrapper, which picks the backend at its first run by
	// counting rules in each; until then the backend is undecided.
	Wrapper bool `json:"wrapper,omitempty"`
}

// Limits on what ReadInstall reads: hostile or odd roots (symlink loops,
// huge files, FIFOs) give an error or an unknown field, never a hang.
const (
	maxLinkHops      = 40
	maxBinaryRead    = 32 << 20
	maxPackageDBRead = 64 << 20
	maxDBLine        = 1 << 20
)

// ErrNotInstalled is returned (wrapped) when no iptables command exists in
// the root.
var ErrNotInstalled = errors.New("iptables not installed")

// commandPaths are where an iptables command is looked up, in PATH order.
var commandPaths = []string{"/usr/local/sbin/iptables", "/usr/sbin/iptables", "/sbin/iptables", "/usr/local/bin/iptables", "/usr/bin/iptables", "/bin/iptables"}

// ReadInstall reads the iptables installed under root, every file afresh
// (InstallReader.Read remembers unchanged files).
func ReadInstall(root string) (Install, error) {
	var r *InstallReader
	return r.Read(root)
}

// Read reads the iptables installed under root, as ReadInstall, answering
// from the memo for a binary or package database unchanged since read.
func (r *InstallReader) Read(root string) (Install, error) {
	in := Install{Root: root}
	var err error
	for _, p := range commandPaths {
		in.Links, err = resolveIn(root, p)
		if err == nil {
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return in, err
		}
	}
	if err != nil {
		return in, fmt.Errorf("%w under %s (looked for %s)", ErrNotInstalled, root, strings.Join(commandPaths, ", "))
	}
	in.Binary = in.Links[len(in.Links)-1]
	for _, l := range in.Links {
		if b := backendOfName(path.Base(l)); b != "" {
			in.Backend, in.BackendSource = b, "name"
		}
		if strings.Contains(path.Base(l), "wrapper") {
			in.Wrapper = true
		}
	}
	if in.Wrapper {
		// The wrapper script has no version string; the multi-call
		// binaries next to it do, but which one runs is not decided yet.
		in.Backend, in.BackendSource = "", ""
	} else if v, b, ok := r.binaryVersion(filepath.Join(root, in.Binary)); ok {
		in.Version, in.VersionSource = v, "binary"
		if b != "" {
			in.Backend, in.BackendSource = b, "binary"
		}
	}
	if in.Version == "" {
		if v, src := r.packageVersion(root); v != "" {
			in.Version, in.VersionSource = v, src
		}
	}
	return in, nil
}

// Describe renders the install for evidence and messages:
// "iptables 1.8.9 (nft) at /usr/sbin/iptables -> /usr/sbin/xtables-nft-multi".
func (in Install) Describe() string {
	b := string(in.Backend)
	switch {
	case in.Wrapper:
		b = "backend undecided: iptables-wrapper not run yet"
	case b == "":
		b = "backend unknown"
	}
	v := in.Version
	if v == "" {
		v = "(version unknown)"
	}
	return fmt.Sprintf("iptables %s (%s) at %s", v, b, strings.Join(in.Links, " -> "))
}

// backendOfName maps the names the xtables binaries and their links carry.
func backendOfName(name string) Backend {
	switch {
	case strings.Contains(name, "nft"):
		return NFT
	case strings.Contains(name, "legacy"), name == "xtables-multi", name == "iptables-multi":
		return Legacy
	}
	return ""
}

// resolveIn resolves p inside root component by component, following every
// symlink (absolute ones relative to root, never out of it) and returns the
// chain of paths it went through: p first, the final regular file last. A
// path that does not exist is os.ErrNotExist (wrapped); more than
// maxLinkHops links (a loop) or a final file that is not regular is an
// error.
func resolveIn(root, p string) ([]string, error) {
	chain := []string{path.Clean("/" + p)}
	hops := 0
	cur := chain[0]
	for {
		resolved, link, err := resolveOnce(root, cur, &hops)
		if err != nil {
			return nil, err
		}
		if link == "" {
			// The final component is not a link.
			fi, err := os.Stat(filepath.Join(root, resolved))
			if err != nil {
				return nil, err
			}
			if !fi.Mode().IsRegular() {
				return nil, fmt.Errorf("%s under %s is not a regular file (%s)", resolved, root, fi.Mode().Type())
			}
			if resolved != chain[len(chain)-1] {
				chain = append(chain, resolved)
			}
			return chain, nil
		}
		chain = append(chain, link)
		cur = link
	}
}

// resolveOnce resolves the directories of p inside root and, if p's last
// component is a symlink, returns its target (as a clean absolute path
// inside root) in link; otherwise p with its directories resolved.
func resolveOnce(root, p string, hops *int) (resolved, link string, err error) {
	parts := strings.Split(strings.TrimPrefix(path.Clean(p), "/"), "/")
	dir := "/"
	for i := 0; i < len(parts); i++ {
		name := parts[i]
		if name == "" || name == "." {
			continue
		}
		if name == ".." {
			dir = path.Dir(dir)
			continue
		}
		next := path.Join(dir, name)
		fi, err := os.Lstat(filepath.Join(root, next))
		if err != nil {
			return "", "", err
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			dir = next
			continue
		}
		*hops++
		if *hops > maxLinkHops {
			return "", "", fmt.Errorf("resolving %s under %s: more than %d symbolic links (a loop?)", p, root, maxLinkHops)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", "", err
		}
		if !path.IsAbs(target) {
			target = path.Join(dir, target)
		}
		target = path.Clean(target)
		if i == len(parts)-1 {
			return "", target, nil
		}
		// A directory link: continue inside its target.
		rest := append(strings.Split(strings.TrimPrefix(target, "/"), "/"), parts[i+1:]...)
		parts, i, dir = rest, -1, "/"
	}
	return dir, "", nil
}

// versionRE matches the version string xtables binaries embed and print
// for --version: "1.8.9 (nf_tables)", "1.8.9 (legacy)".
var versionRE = regexp.MustCompile(`\x00v?([0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?) \((nf_tables|legacy)\)\x00`)

// binaryVersion scans at most maxBinaryRead bytes of a regular file for the
// embedded version string.
func binaryVersion(file string) (version string, b Backend, ok bool) {
	var r *InstallReader
	return r.binaryVersion(file)
}

func (r *InstallReader) binaryVersion(file string) (version string, b Backend, ok bool) {
	res := r.readFile(file, kindBinary, maxBinaryRead, func(rd io.Reader) fileResult {
		v, b, ok := scanVersion(rd)
		return fileResult{version: v, backend: b, ok: ok}
	})
	return res.version, res.backend, res.ok
}

// scanVersion finds the embedded version string in r, reading it in chunks
// that overlap by more than the longest match.
func scanVersion(r io.Reader) (version string, b Backend, ok bool) {
	const chunk, overlap = 256 << 10, 64
	buf := make([]byte, 0, chunk+overlap)
	tmp := make([]byte, chunk)
	for {
		n, err := io.ReadFull(r, tmp)
		buf = append(buf, tmp[:n]...)
		if m := versionRE.FindSubmatch(buf); m != nil {
			b := Legacy
			if string(m[2]) == "nf_tables" {
				b = NFT
			}
			return string(m[1]), b, true
		}
		if err != nil {
			return "", "", false
		}
		if len(buf) > overlap {
			buf = append(buf[:0], buf[len(buf)-overlap:]...)
		}
	}
}

// packageVersion reads iptables' version from the root's package
// database: dpkg (status, or distroless status.d/), then apk.
func (r *InstallReader) packageVersion(root string) (version, source string) {
	for _, db := range []string{"/var/lib/dpkg/status.d/iptables", "/var/lib/dpkg/status"} {
		if v := r.readDBVersion(root, db, kindDpkg, ParseDpkgStatus); v != "" {
			return v, "dpkg"
		}
	}
	if v := r.readDBVersion(root, "/lib/apk/db/installed", kindApk, ParseApkInstalled); v != "" {
		return v, "apk"
	}
	return "", ""
}

func (r *InstallReader) readDBVersion(root, db string, kind fileKind, parse func(io.Reader, string) string) string {
	links, err := resolveIn(root, db)
	if err != nil {
		return ""
	}
	return r.readFile(filepath.Join(root, links[len(links)-1]), kind, maxPackageDBRead, func(rd io.Reader) fileResult {
		return fileResult{version: parse(rd, "iptables")}
	}).version
}

// dbLines calls fn for each line of r (lines longer than maxDBLine are
// skipped) until fn returns false.
func dbLines(r io.Reader, fn func(line string) bool) {
	br := bufio.NewReaderSize(r, 64<<10)
	var acc []byte
	skip := false
	for {
		frag, isPrefix, err := br.ReadLine()
		if err != nil {
			return
		}
		if !skip {
			if len(acc)+len(frag) > maxDBLine {
				skip, acc = true, acc[:0]
			} else {
				acc = append(acc, frag...)
			}
		}
		if isPrefix {
			continue
		}
		if !skip && !fn(string(acc)) {
			return
		}
		acc, skip = acc[:0], false
	}
}

// ParseDpkgStatus returns the version of the installed package pkg in dpkg
// status format (stanzas of "Field: value" separated by blank lines; only
// "install ok installed" counts), "" when absent.
func ParseDpkgStatus(r io.Reader, pkg string) string {
	var name, status, version string
	found := ""
	flush := func() bool {
		if name == pkg && version != "" && (status == "" || strings.HasSuffix(status, " installed")) {
			found = version
			return false
		}
		name, status, version = "", "", ""
		return true
	}
	dbLines(r, func(line string) bool {
		if strings.TrimSpace(line) == "" {
			return flush()
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || strings.HasPrefix(line, " ") {
			return true
		}
		switch k {
		case "Package":
			name = strings.TrimSpace(v)
		case "Status":
			status = strings.TrimSpace(v)
		case "Version":
			version = cleanVersion(strings.TrimSpace(v))
		}
		return true
	})
	if found == "" {
		flush()
	}
	return found
}

// ParseApkInstalled returns the version of package pkg in Alpine's
// installed database ("P:name" and "V:version" lines per package), "" when
// absent.
func ParseApkInstalled(r io.Reader, pkg string) string {
	var name, found string
	dbLines(r, func(line string) bool {
		switch {
		case line == "":
			name = ""
		case strings.HasPrefix(line, "P:"):
			name = line[2:]
		case strings.HasPrefix(line, "V:") && name == pkg:
			found = cleanVersion(line[2:])
			return false
		}
		return true
	})
	return found
}

// cleanVersion strips a package version to upstream's "1.8.9": the epoch
// ("1:"), the revision ("-2", "-r3") and anything after the numbers.
func cleanVersion(v string) string {
	if i := strings.IndexByte(v, ':'); i >= 0 && i < 4 {
		v = v[i+1:]
	}
	end := 0
	for end < len(v) && (v[end] >= '0' && v[end] <= '9' || v[end] == '.') {
		end++
	}
	v = strings.TrimRight(v[:end], ".")
	if len(v) > 32 {
		return ""
	}
	return v
}

// VersionParts splits "1.8.9" into numbers; ok is false for anything else.
func VersionParts(v string) (major, minor, patch int, ok bool) {
	f := strings.Split(v, ".")
	if len(f) < 2 || len(f) > 3 {
		return 0, 0, 0, false
	}
	nums := make([]int, 3)
	for i, s := range f {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n > 999 {
			return 0, 0, 0, false
		}
		nums[i] = n
	}
	return nums[0], nums[1], nums[2], true
}
