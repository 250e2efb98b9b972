// Package kmod tells whether the kernel has a netfilter module, read-only
// and without loading anything: /proc/modules (loaded modules), the xtables
// extension registry (/proc/net/ip_tables_matches, ..._targets, which
// lists matches and targets whether built in or loaded), the tables in use
// (/proc/net/ip_tables_names), the kernel's configuration
// (/proc/config.gz: built in, or built without), /sys/module/<name> and the host's
// /lib/modules/<release>/modules.builtin and modules.dep (built in, or
// loadable on first use). A kernel without module support has no
// /proc/modules: everything it has is built in. When no source can say, the
// answer is Unknown, never Missing.
package kmod

import (
	"bufio"
	"github.com/remediate-dev/remediate/internal/boundedfile"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// State of one module.
type State string

// States, from most to least certain presence.
const (
	// Loaded: listed in /proc/modules.
	Loaded State = "loaded"
	// Registered: the xtables extension or table it provides is
	// registered (built in or loaded).
	Registered State = "registered"
	// Builtin: listed in modules.builtin, or in /sys/module without being
	// loaded.
	Builtin State = "builtin"
	// Loadable: not loaded but on disk (modules.dep): the kernel loads it
	// at first use.
	Loadable State = "loadable"
	// Missing: neither loaded, registered, built in nor on disk, and the
	// module lists were readable.
	Missing State = "missing"
	// Unknown: not loaded, and nothing says whether it is built in or
	// available.
	Unknown State = "unknown"
)

// Present reports whether the kernel has the module or will load it.
func (s State) Present() bool { return s != Missing && s != Unknown }

// Limits on what is read.
const (
	maxFile = 16 << 20
	maxLine = 64 << 10
)

// Family selects the IPv4 or IPv6 xtables registry.
type Family int

// Families.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// Snapshot is what the sources said at one read.
type Snapshot struct {
	// Loaded are the modules in /proc/modules; nil when the file does
	// not exist (no module support: HasModules false) or is unreadable.
	Loaded map[string]bool
	// HasModules is false when the kernel has no /proc/modules (built
	// without module support).
	HasModules bool
	// Matches, Targets and Tables are the registered xtables extensions
	// and the tables in use per family (nil when unreadable).
	Matches, Targets, Tables map[Family]map[string]bool
	// Builtin and OnDisk come from the host's modules.builtin and
	// modules.dep (nil when unreadable).
	Builtin, OnDisk map[string]bool
	// Config is the kernel's configuration from /proc/config.gz (nil when
	// the kernel does not expose it, CONFIG_IKCONFIG_PROC).
	Config map[string]string
	// Release is the kernel release the module lists were read for.
	Release string
	// Sources lists what was read, Errors what could not be.
	Sources, Errors []string

	sysModule func(string) bool
}

// Read reads the sources: procRoot is /proc (or --proc-root), hostRoot the
// host's root filesystem (for /lib/modules and /sys/module; "" skips them).
func Read(procRoot, hostRoot string) *Snapshot {
	s := &Snapshot{
		Matches: map[Family]map[string]bool{}, Targets: map[Family]map[string]bool{}, Tables: map[Family]map[string]bool{},
	}
	note := func(src string, err error) {
		if err != nil {
			s.Errors = append(s.Errors, err.Error())
		} else {
			s.Sources = append(s.Sources, src)
		}
	}
	pm := filepath.Join(procRoot, "modules")
	if err := readFile(pm, func(r io.Reader) { s.Loaded = ParseProcModules(r) }); err == nil {
		s.HasModules = true
		note(pm, nil)
	} else if os.IsNotExist(err) {
		// No module support: nothing is loadable, everything present is
		// built in (and shows in the registries below).
		s.HasModules = false
		s.Loaded = map[string]bool{}
		s.Sources = append(s.Sources, pm+" absent (kernel without module support)")
	} else {
		s.HasModules = true
		note(pm, err)
	}
	for _, f := range []Family{IPv4, IPv6} {
		pre := "ip_tables_"
		if f == IPv6 {
			pre = "ip6_tables_"
		}
		for kind, dst := range map[string]map[Family]map[string]bool{"matches": s.Matches, "targets": s.Targets, "names": s.Tables} {
			p := filepath.Join(procRoot, "net", pre+kind)
			if err := readFile(p, func(r io.Reader) { dst[f] = ParseNames(r) }); err == nil {
				note(p, nil)
			}
		}
	}
	cz := filepath.Join(procRoot, "config.gz")
	if cfg, err := readConfig(cz); err == nil {
		s.Config = cfg
		note(cz, nil)
	} else if !os.IsNotExist(err) {
		note(cz, err)
	}
	if hostRoot != "" {
		rel, err := boundedfile.Read(filepath.Join(procRoot, "sys", "kernel", "osrelease"), 4096)
		if err == nil {
			s.Release = strings.TrimSpace(string(rel))
		}
		if s.HasModules && validRelease(s.Release) {
			for _, lib := range []string{"lib", "usr/lib"} {
				dir := filepath.Join(hostRoot, lib, "modules", s.Release)
				if s.Builtin == nil {
					p := filepath.Join(dir, "modules.builtin")
					if err := readFile(p, func(r io.Reader) { s.Builtin = ParseModuleList(r) }); err == nil {
						note(p, nil)
					}
				}
				if s.OnDisk == nil {
					p := filepath.Join(dir, "modules.dep")
					if err := readFile(p, func(r io.Reader) { s.OnDisk = ParseModuleList(r) }); err == nil {
						note(p, nil)
					}
				}
			}
			if s.Builtin == nil || s.OnDisk == nil {
				s.Errors = append(s.Errors, "modules.builtin/modules.dep not readable under "+filepath.Join(hostRoot, "{lib,usr/lib}", "modules", s.Release))
			}
		}
		sys := filepath.Join(hostRoot, "sys", "module")
		s.sysModule = func(name string) bool {
			_, err := os.Lstat(filepath.Join(sys, name))
			return err == nil
		}
	}
	return s
}

func validRelease(r string) bool {
	return r != "" && len(r) < 256 && !strings.ContainsAny(r, "/\x00") && r != "." && r != ".."
}

// Provides says how a module shows itself besides /proc/modules: the
// xtables matches, targets or tables it registers.
type Provides struct {
	Family  Family
	Matches []string
	Targets []string
	Tables  []string
}

// State returns the module's state; prov lists what it registers, if
// anything.
func (s *Snapshot) State(module string, prov Provides) State {
	module = Normalize(module)
	if s.Loaded[module] {
		return Loaded
	}
	if prov.registered(s) {
		return Registered
	}
	if s.Builtin[module] || (s.sysModule != nil && s.sysModule(module)) {
		return Builtin
	}
	if s.OnDisk[module] {
		return Loadable
	}
	if c := s.configState(module); c != "" {
		// The kernel was built with it (=y) or without it ("is not
		// set"): certain, whatever else could not be read.
		return c
	}
	if !s.HasModules {
		// Everything is built in: an extension the registry does not
		// list is absent; a module without one cannot be told.
		if prov.readable(s) {
			return Missing
		}
		return Unknown
	}
	if s.Loaded != nil && s.Builtin != nil && s.OnDisk != nil {
		return Missing
	}
	return Unknown
}

// readable reports whether the match and target registries p needs were
// read. Tables never prove absence: ip_tables_names lists only the tables
// instantiated in the network namespace so far.
func (p Provides) readable(s *Snapshot) bool {
	if len(p.Matches)+len(p.Targets) == 0 {
		return false
	}
	return (len(p.Matches) == 0 || s.Matches[p.Family] != nil) &&
		(len(p.Targets) == 0 || s.Targets[p.Family] != nil)
}

func (p Provides) registered(s *Snapshot) bool {
	if len(p.Matches)+len(p.Targets)+len(p.Tables) == 0 {
		return false
	}
	for _, c := range []struct {
		names []string
		reg   map[string]bool
	}{{p.Matches, s.Matches[p.Family]}, {p.Targets, s.Targets[p.Family]}, {p.Tables, s.Tables[p.Family]}} {
		for _, n := range c.names {
			if !c.reg[n] {
				return false
			}
		}
	}
	return true
}

// Normalize spells a module name as the kernel lists it (dashes as
// underscores).
func Normalize(name string) string { return strings.ReplaceAll(name, "-", "_") }

func readFile(p string, parse func(io.Reader)) error {
	f, err := boundedfile.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	parse(io.LimitReader(f, maxFile))
	return nil
}

// lines calls fn with each line of r, skipping lines over maxLine.
func lines(r io.Reader, fn func(string)) {
	sc := bufio.NewScanner(r)
	// The lines are short (a module or extension name and a few
	// fields): start small, grow up to maxLine only when needed. Seven
	// files are read every cycle; 64 KiB each was 450 KB of garbage.
	sc.Buffer(make([]byte, 0, 4<<10), maxLine)
	for sc.Scan() {
		fn(sc.Text())
	}
	// A line over maxLine ends the scan: what was read so far stands.
}

// ParseProcModules parses /proc/modules ("name size refcount deps state
// address" per line) into the set of module names.
func ParseProcModules(r io.Reader) map[string]bool {
	out := map[string]bool{}
	lines(r, func(l string) {
		if f := strings.Fields(l); len(f) > 0 && len(f[0]) < 64 {
			out[Normalize(f[0])] = true
		}
	})
	return out
}

// ParseNames parses a one-name-per-line list (/proc/net/ip_tables_matches,
// _targets, _names).
func ParseNames(r io.Reader) map[string]bool {
	out := map[string]bool{}
	lines(r, func(l string) {
		if l = strings.TrimSpace(l); l != "" && len(l) < 64 {
			out[l] = true
		}
	})
	return out
}

// ParseModuleList parses modules.builtin ("kernel/net/netfilter/xt_mark.ko"
// per line) or modules.dep ("kernel/.../xt_mark.ko.xz: deps...") into the
// set of module names.
func ParseModuleList(r io.Reader) map[string]bool {
	out := map[string]bool{}
	lines(r, func(l string) {
		p, _, _ := strings.Cut(l, ":")
		base := path.Base(strings.TrimSpace(p))
		i := strings.Index(base, ".ko")
		if i <= 0 || i > 64 {
			return
		}
		out[Normalize(base[:i])] = true
	})
	return out
}
