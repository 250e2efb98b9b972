// Package cni reads the node's CNI configuration read-only: the network
// configuration directory (default /etc/cni/net.d) and the plugin binary
// directory (default /opt/cni/bin), both host paths mounted read-only into
// the daemon. Reads are bounded (entries, files, bytes per file) and never
// block on a FIFO; a hostile or broken directory gives an answer, never a
// hang.
//
// Which file is in use: the container runtime (containerd's go-cni, CRI-O)
// loads the configuration files (*.conf, *.conflist, *.json) in name order
// and uses the first network it can load. containerd stops at the first file
// it cannot parse, so the first file by name decides; a later broken file is
// a warning only.
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/remediate-dev/remediate/internal/boundedfile"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Defaults of the directories, as the kubelet and container runtimes have
// them.
const (
	DefaultConfDir = "/etc/cni/net.d"
	DefaultBinDir  = "/opt/cni/bin"
)

// Bounds of one read of a directory.
const (
	// MaxFileSize is the largest configuration file read; a bigger one is
	// reported as unparseable ("too large").
	MaxFileSize = 1 << 20
	// MaxFiles is how many configuration files are read (in name order).
	MaxFiles = 32
	// maxEntries bounds the directory entries listed.
	maxEntries = 4096
)

// Extensions are the file name extensions libcni loads.
var Extensions = []string{".conf", ".conflist", ".json"}

// File is one configuration file of the directory.
type File struct {
	// Name is the file's base name.
	Name string `json:"name"`
	// Network is the network's name, Version its cniVersion.
	Network string `json:"network,omitempty"`
	Version string `json:"cniVersion,omitempty"`
	// Plugins are the plugin types the file chains, in order.
	Plugins []string `json:"plugins,omitempty"`
	// Err says why the file cannot be loaded (empty when it can).
	Err string `json:"error,omitempty"`
	// MissingPlugins are the plugin types with no executable in the bin
	// directory (checked for the file in use only).
	MissingPlugins []string `json:"missingPlugins,omitempty"`
	// Data is the file's content as read (at most MaxFileSize), kept for
	// the file in use only: the detectors that parse more of it (host-local
	// IPAM) read these bytes, not the file again. Read only.
	Data []byte `json:"-"`
}

// Dir is what one read of the configuration found.
type Dir struct {
	ConfDir string `json:"confDir"`
	BinDir  string `json:"binDir"`
	// ConfDirErr is set when the configuration directory cannot be listed
	// (missing: errors.Is(err, fs.ErrNotExist)).
	ConfDirErr error `json:"-"`
	// BinDirErr is set when the bin directory cannot be read.
	BinDirErr error `json:"-"`
	// Files are the configuration files in name order (at most MaxFiles).
	Files []File `json:"files"`
	// Omitted counts configuration files beyond MaxFiles.
	Omitted int `json:"omitted,omitempty"`
}

// InUse returns the file the runtime loads (the first by name), or nil when
// there is none.
func (d *Dir) InUse() *File {
	if len(d.Files) == 0 {
		return nil
	}
	return &d.Files[0]
}

// Read reads confDir and, for the file in use, checks its plugins against
// binDir.
func Read(confDir, binDir string) Dir {
	d := Dir{ConfDir: confDir, BinDir: binDir}
	names, omitted, err := listConf(confDir)
	if err != nil {
		d.ConfDirErr = err
		return d
	}
	d.Omitted = omitted
	for _, n := range names {
		f := File{Name: n}
		data, err := boundedfile.Read(filepath.Join(confDir, n), MaxFileSize)
		if err == nil {
			f.Network, f.Version, f.Plugins, err = Parse(n, data)
			if len(d.Files) == 0 {
				f.Data = data
			}
		}
		if err != nil {
			f.Err = err.Error()
		}
		d.Files = append(d.Files, f)
	}
	if f := d.InUse(); f != nil && f.Err == "" && binDir != "" {
		f.MissingPlugins, d.BinDirErr = missingPlugins(binDir, f.Plugins)
	}
	return d
}

func listConf(dir string) (names []string, omitted int, err error) {
	fd, err := boundedfile.OpenDir(dir)
	if err != nil {
		return nil, 0, err
	}
	defer fd.Close()
	fi, err := fd.Stat()
	if err != nil {
		return nil, 0, err
	}
	if !fi.IsDir() {
		return nil, 0, fmt.Errorf("%s is not a directory", dir)
	}
	ents, err := fd.ReadDir(maxEntries)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, 0, fmt.Errorf("listing %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		for _, ext := range Extensions {
			if filepath.Ext(e.Name()) == ext {
				names = append(names, e.Name())
				break
			}
		}
	}
	sort.Strings(names)
	if len(names) > MaxFiles {
		omitted = len(names) - MaxFiles
		names = names[:MaxFiles]
	}
	return names, omitted, nil
}

// Parse reads one configuration file as libcni would: a *.conflist is a
// network configuration list (name and at least one plugin, each with a
// type), any other a single network configuration (a type). It returns
// the network name, cniVersion and plugin types.
func Parse(name string, data []byte) (network, version string, plugins []string, err error) {
	type plugin struct {
		Type string `json:"type"`
	}
	var c struct {
		CNIVersion string            `json:"cniVersion"`
		Name       string            `json:"name"`
		Type       string            `json:"type"`
		Plugins    []json.RawMessage `json:"plugins"`
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return "", "", nil, errors.New("empty file")
	}
	if err := json.Unmarshal(data, &c); err != nil {
		return "", "", nil, fmt.Errorf("not a CNI configuration: %w", err)
	}
	if strings.HasSuffix(name, ".conflist") {
		if c.Name == "" {
			return "", c.CNIVersion, nil, errors.New("configuration list has no name")
		}
		if len(c.Plugins) == 0 {
			return c.Name, c.CNIVersion, nil, errors.New("configuration list has no plugins")
		}
		for i, raw := range c.Plugins {
			var p plugin
			if err := json.Unmarshal(raw, &p); err != nil {
				return c.Name, c.CNIVersion, nil, fmt.Errorf("plugin %d: %w", i, err)
			}
			if err := checkType(p.Type); err != nil {
				return c.Name, c.CNIVersion, nil, fmt.Errorf("plugin %d: %w", i, err)
			}
			plugins = append(plugins, p.Type)
		}
		return c.Name, c.CNIVersion, plugins, nil
	}
	if err := checkType(c.Type); err != nil {
		return c.Name, c.CNIVersion, nil, err
	}
	return c.Name, c.CNIVersion, []string{c.Type}, nil
}

// checkType accepts a plugin type that names a file in the bin directory.
func checkType(t string) error {
	switch {
	case t == "":
		return errors.New("no plugin type")
	case len(t) > 255 || strings.ContainsAny(t, "/\x00") || t == "." || t == "..":
		return fmt.Errorf("plugin type %q is not a file name", t)
	}
	return nil
}

// missingPlugins returns the types with no executable regular file in
// binDir (duplicates once, in order).
func missingPlugins(binDir string, types []string) ([]string, error) {
	fi, err := os.Stat(binDir)
	if err != nil {
		return types, err
	}
	if !fi.IsDir() {
		return types, fmt.Errorf("%s is not a directory", binDir)
	}
	var missing []string
	seen := map[string]bool{}
	for _, t := range types {
		if seen[t] {
			continue
		}
		seen[t] = true
		st, err := os.Stat(filepath.Join(binDir, t))
		if err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			missing = append(missing, t)
		}
	}
	return missing, nil
}
