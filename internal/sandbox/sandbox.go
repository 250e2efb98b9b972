// Package sandbox confines the daemon's own file access with Landlock
// (Linux 5.13+), so that a process with the pod's capabilities, the host's
// PID namespace and hostPath mounts has no route to host files outside the
// paths it needs.
//
// Landlock judges the file an open resolves to by walking up its own
// hierarchy (dentries and mounts), not by the name the caller used. So
// once restricted:
//
//   - <proc-root>/<pid>/root/etc/shadow of a host process lands in the
//     host's root filesystem, outside every allowed hierarchy, and is
//     refused, while <proc-root>/<pid>/stat stays readable;
//   - open_by_handle_at with a crafted handle, through a mounted directory,
//     lands on a dentry whose ancestors carry no rule, and is refused;
//   - a symlink planted in a mounted directory that points out of it
//     (through /proc/<pid>/root) is refused the same way;
//   - connecting to an abstract UNIX socket of a host process (the pod
//     shares the host's network namespace) is refused (ABI 6+);
//   - writes are allowed only where the daemon writes (its state
//     directory, the conntrack sysctls under
//     <proc-root>/sys/net/netfilter, the conntrack hashsize, /tmp): a
//     writable host /proc no longer lets it write kernel.core_pattern.
//
// A Landlock domain also refuses every ptrace access check (the /proc
// files guarded by ptrace_may_access: exe, fd, fdinfo, root, cwd, environ,
// maps, ns) towards processes outside the domain, whatever the
// capabilities: the daemon restricts itself only when it runs without
// CAP_SYS_PTRACE (the caller decides; see cmd/remediate).
//
// Children (iptables-save, nft, conntrack) inherit the domain; the rules
// therefore cover what they read (the image's /usr, libraries, a few /etc
// files, /proc/net).
//
// Best effort: on a kernel without Landlock, Apply restricts nothing and
// says so in its Status; it never fails the daemon.
package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/landlock-lsm/go-landlock/landlock"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
)

// Access is what a Rule allows beneath its path.
type Access int

const (
	// Read opens files for reading and lists directories.
	Read Access = iota
	// ReadExec also executes files (the image's programs and libraries).
	ReadExec
	// ReadWrite also writes, truncates, creates and removes files and
	// directories (renames only within one directory).
	ReadWrite
)

func (a Access) String() string {
	switch a {
	case Read:
		return "read"
	case ReadExec:
		return "read+exec"
	case ReadWrite:
		return "read+write"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

// Rule allows Access to the file or directory hierarchy at Path.
type Rule struct {
	Path   string
	Access Access
	// Why names who needs it (logged at debug, shown in tests' failures).
	Why string
}

// Config is what the daemon reaches, as configured by its flags.
type Config struct {
	ProcRoot    string // --proc-root (read; writes only under sys/net/netfilter)
	HostRoot    string // --host-root, if set (read)
	SysRoot     string // --sys-root (read; writes only to the conntrack module's parameters)
	CgroupRoot  string // --cgroup-root (read)
	CNIDirs     []string
	PodLogDir   string // --pod-log-dir (read)
	CRISocket   string // --cri-socket (its directory, read)
	StateDir    string // read and write
	JournalDir  string // the state dir as given, when a dry run works on a copy (read)
	XtablesLock string // read (watched with inotify and stat, never opened: no child takes it)
	Policy      string // its directory (a ConfigMap swaps a symlink), read
	Kubeconfig  []string
	KubeletCA   string
	Bundle      string // --bundle: its directory, read and write
	TempDir     string // os.TempDir(): the dry-run state copy, read and write
}

// image are the hierarchies of the daemon's own root filesystem its
// children need: programs and libraries (read and execute), and the few
// /etc files they and the Go runtime read. Never the whole of /etc or /:
// in tests the daemon's root is the host's.
var image = []Rule{
	{"/usr", ReadExec, "programs, libraries, xtables extensions, zoneinfo"},
	{"/bin", ReadExec, "programs (a link to /usr/bin on merged-usr images)"},
	{"/sbin", ReadExec, "iptables-*, nft, conntrack"},
	{"/lib", ReadExec, "libraries"},
	{"/lib64", ReadExec, "the dynamic loader"},
	{"/lib32", ReadExec, "libraries"},
	{"/libx32", ReadExec, "libraries"},
	{"/etc/ld.so.cache", Read, "the dynamic loader"},
	{"/etc/ld.so.preload", Read, "the dynamic loader"},
	{"/etc/protocols", Read, "iptables-save, nft: protocol names"},
	{"/etc/services", Read, "iptables-save, nft: port names"},
	{"/etc/ethertypes", Read, "ebtables/nft: ethertype names"},
	{"/etc/iproute2", Read, "nft: realms and groups"},
	{"/etc/xtables", Read, "iptables: connlabel.conf"},
	{"/etc/nsswitch.conf", Read, "name lookups"},
	{"/etc/hosts", Read, "name lookups"},
	{"/etc/resolv.conf", Read, "name lookups"},
	{"/etc/host.conf", Read, "name lookups"},
	{"/etc/gai.conf", Read, "name lookups"},
	{"/etc/passwd", Read, "nft: user names in skuid rules"},
	{"/etc/group", Read, "nft: group names in skgid rules"},
	{"/etc/localtime", Read, "the time zone of log lines"},
	{"/etc/ssl", Read, "system CA certificates"},
	{"/etc/pki", Read, "system CA certificates"},
	{"/etc/ca-certificates", Read, "system CA certificates"},
	{"/var/run/secrets/kubernetes.io/serviceaccount", Read, "the in-cluster token and CA (re-read on rotation)"},
	{"/proc", Read, "the daemon's and its children's own /proc (self, net)"},
	{"/sys", Read, "the container's own cgroup and sysfs"},
	{"/dev/null", ReadWrite, "children's stdin"},
	{"/dev/urandom", Read, "nft"},
}

// Rules are the rules for c: the image's, then c's paths. Empty paths are
// left out; paths are cleaned.
func Rules(c Config) []Rule {
	out := append([]Rule(nil), image...)
	add := func(p string, a Access, why string) {
		if p != "" {
			out = append(out, Rule{filepath.Clean(p), a, why})
		}
	}
	add(c.ProcRoot, Read, "--proc-root: processes, locks, /proc/net, sysctls")
	if c.ProcRoot != "" {
		// The only sysctls the daemon writes (nf_conntrack_max and the
		// conntrack timeouts). The directory exists once nf_conntrack is
		// loaded; before, the rule falls back to sys/net (see Apply).
		add(filepath.Join(c.ProcRoot, "sys", "net", "netfilter"), ReadWrite, "RaiseConntrackMax, SetConntrackTimeouts")
	}
	add(c.HostRoot, Read, "--host-root: the host's iptables install")
	add(c.SysRoot, Read, "--sys-root")
	if c.SysRoot != "" {
		add(filepath.Join(c.SysRoot, "module", "nf_conntrack", "parameters"), ReadWrite, "RaiseConntrackMax: hashsize")
	}
	add(c.CgroupRoot, Read, "--cgroup-root: kube-proxy's cpu.stat")
	for _, d := range c.CNIDirs {
		add(d, Read, "CNIConfig, HostLocalIPAM")
	}
	add(c.PodLogDir, Read, "--pod-log-dir: kube-proxy's and the CNI agents' log tails")
	if c.CRISocket != "" {
		add(dirOf(c.CRISocket), Read, "--cri-socket")
	}
	add(c.StateDir, ReadWrite, "--state-dir: guardrail state, journal")
	add(c.JournalDir, Read, "the journal's tail for --bundle")
	add(c.XtablesLock, Read, "--xtables-lock (watched, never taken)")
	if c.Policy != "" {
		add(dirOf(c.Policy), Read, "--policy (reloaded)")
	}
	for _, k := range c.Kubeconfig {
		if k != "" {
			add(dirOf(k), Read, "kubeconfig (and the files it names beside it)")
		}
	}
	add(c.KubeletCA, Read, "--kubelet-ca")
	if c.Bundle != "" {
		add(dirOf(c.Bundle), ReadWrite, "--bundle")
	}
	add(c.TempDir, ReadWrite, "the dry-run copy of the state")
	return out
}

// dirOf is the directory of file, or file itself when that directory is
// the root (a rule on / would allow everything).
func dirOf(file string) string {
	d := filepath.Dir(filepath.Clean(file))
	if d == "/" || d == "." {
		return file
	}
	return d
}

// Status says what Apply did.
type Status struct {
	// Enforced: the process and its future children are restricted.
	Enforced bool
	// ABI is the kernel's Landlock ABI version (0: none).
	ABI int
	// Reason says why nothing was restricted (empty when Enforced).
	Reason string
	// Rules is how many rules were applied; Missing the rule paths that
	// did not exist (nothing granted there).
	Rules   int
	Missing []string
}

// String is one line for the log and the --once report.
func (s Status) String() string {
	if !s.Enforced {
		return "landlock: not enforced: " + s.Reason
	}
	return fmt.Sprintf("landlock: enforced (kernel ABI %d, %d rules)", s.ABI, s.Rules)
}

// handled are the filesystem rights restricted: every right of ABI 5 to 7
// (pinned, so that a newer kernel does not start refusing what a newer
// ABI adds, such as connect(2) to the CRI socket in ABI 9), and, from ABI
// 6, connecting to abstract UNIX sockets of processes outside the domain
// (hostNetwork shares the host's: containerd-shim listened on one,
// CVE-2020-15257; the daemon uses none). Network ports and signals are
// not restricted: the daemon must reach kube-proxy and the API and signal
// hung processes.
var handled = landlock.MustConfig(landlock.V5.HandledAccessFS, landlock.ScopedSet(ll.ScopeAbstractUnixSocket)).BestEffort()

// rights are the Landlock rights for a on a directory or on a file.
func rights(a Access, dir bool) landlock.AccessFSSet {
	var r landlock.AccessFSSet = ll.AccessFSReadFile
	if dir {
		r |= ll.AccessFSReadDir
	}
	if a == ReadExec {
		r |= ll.AccessFSExecute
	}
	if a == ReadWrite {
		r |= ll.AccessFSWriteFile | ll.AccessFSTruncate
		if dir {
			r |= ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeDir | ll.AccessFSMakeReg |
				ll.AccessFSMakeSock | ll.AccessFSMakeFifo | ll.AccessFSMakeSym
		}
	}
	return r
}

// ABI is the running kernel's Landlock ABI version, or 0 and why not.
func ABI() (int, error) {
	v, err := ll.LandlockGetABIVersion()
	if err != nil {
		return 0, err
	}
	return v, nil
}

// Apply restricts this process (every thread) and its future children to
// rules. Paths that do not exist are skipped (Status.Missing); the
// netfilter sysctl directory falls back to its parent when nf_conntrack
// is not loaded yet. A kernel without Landlock gives Enforced false and
// the reason, not an error; an error is a rule Landlock refused (the
// process is then not restricted).
func Apply(rules []Rule) (Status, error) {
	abi, err := ABI()
	if err != nil || abi < 1 {
		why := "the kernel has no Landlock"
		if err != nil {
			why += fmt.Sprintf(" (landlock_create_ruleset: %v)", err)
		}
		return Status{Reason: why + "; CONFIG_SECURITY_LANDLOCK and landlock in the lsm= boot list enable it"}, nil
	}
	st := Status{ABI: abi}
	var lr []landlock.Rule
	seen := map[Rule]bool{}
	for _, r := range rules {
		fi, err := os.Stat(r.Path)
		if errors.Is(err, os.ErrNotExist) && r.Access == ReadWrite && strings.HasSuffix(r.Path, filepath.Join("sys", "net", "netfilter")) {
			r.Path = filepath.Dir(r.Path)
			fi, err = os.Stat(r.Path)
		}
		if err != nil {
			st.Missing = append(st.Missing, r.Path)
			continue
		}
		if seen[r] {
			continue
		}
		seen[r] = true
		lr = append(lr, landlock.PathAccess(rights(r.Access, fi.IsDir()), r.Path))
	}
	if err := handled.Restrict(lr...); err != nil {
		return Status{ABI: abi, Reason: err.Error()}, fmt.Errorf("landlock: %w", err)
	}
	st.Enforced, st.Rules = true, len(lr)
	sort.Strings(st.Missing)
	return st, nil
}
