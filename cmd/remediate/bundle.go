package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/bundle"
	"github.com/remediate-dev/remediate/internal/httpget"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/internal/ipvs"
	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/node"
	"github.com/remediate-dev/remediate/policy"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/journal"
)

// The evidence bundle of --once --bundle FILE.tar.gz: what an engineer
// would otherwise gather by hand on a sick node, read the way the
// detectors read it (never through the xtables lock, never a process's
// environment), each part bounded and redacted by package bundle.
const (
	// bundleTimeout bounds the whole collection; each command and request
	// has its own, shorter deadline.
	bundleTimeout = 90 * time.Second
	// httpTimeout bounds each kube-proxy request.
	httpTimeout = 5 * time.Second
	// cmdTimeout bounds nft and the version commands (saves use the
	// iptables adapter's own 30 s).
	cmdTimeout = 10 * time.Second
	// maxIPVSConns bounds the IPVS connection lines (a busy node has
	// millions; the part's cap would cut them anyway).
	maxIPVSConns = 100000
	// journalTail is how many of the journal's last records go in.
	journalTail = 200
)

// bundleProcessNames are the processes listed with their ages and states:
// every iptables and nft command name kube-proxy and the node run, and
// kube-proxy itself.
var bundleProcessNames = func() []string {
	names := []string{"nft", "kube-proxy", "xtables-legacy-multi", "xtables-nft-multi", "xtables-multi"}
	for _, bin := range []string{"iptables", "ip6tables"} {
		for _, s := range []string{"", "-restore", "-save", "-legacy", "-nft", "-legacy-restore", "-nft-restore", "-legacy-save", "-nft-save", "-wrapper"} {
			names = append(names, bin+s)
		}
	}
	return names
}()

// collector gathers the parts into a bundle.Writer; a part that cannot be
// obtained is still added, empty, with its error in the manifest.
type collector struct {
	w       *bundle.Writer
	n       *node.Node
	o       *options
	pol     *policy.Policy
	partMax int
	errs    []error
	// http makes every request of the bundle (httpget's client).
	http *http.Client
}

func (c *collector) add(name, how string, data []byte, err error) {
	if aerr := c.w.Add(name, how, data, err); aerr != nil {
		c.errs = append(c.errs, aerr)
	}
}

func (c *collector) addJSON(name, how string, v any, err error) {
	var data []byte
	if v != nil {
		var merr error
		data, merr = json.MarshalIndent(v, "", "  ")
		err = errors.Join(err, merr)
		data = append(data, '\n')
	}
	c.add(name, how, data, err)
}

// writeBundle writes the bundle of one --once run to o.bundle: the report
// (text and JSON) and the node's evidence. It returns the manifest's part
// count and an error when the file could not be written.
func writeBundle(ctx context.Context, o *options, pol *policy.Policy, wi *wiring, rep *remediate.Report) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, bundleTimeout)
	defer cancel()
	n, err := wi.Node(pol)
	if err != nil {
		return 0, fmt.Errorf("bundle: building the node's adapters: %w", err)
	}
	w, err := bundle.Create(o.bundle, bundle.Options{Node: o.nodeName, Version: version, MaxBytes: int64(o.bundleMaxMiB) << 20})
	if err != nil {
		return 0, err
	}
	c := &collector{w: w, n: n, o: o, pol: pol, partMax: bundle.DefaultMaxPartBytes, http: httpget.NewClient(httpget.Options{Timeout: httpTimeout})}
	var txt, js bytes.Buffer
	terr := rep.WriteText(&txt)
	c.add(bundle.ReportTextName, "the --once report (text)", txt.Bytes(), terr)
	jerr := rep.WriteJSON(&js)
	c.add(bundle.ReportJSONName, "the --once report (-o json)", js.Bytes(), jerr)
	c.versions(ctx)
	c.iptablesSaves(ctx)
	c.nftTables(ctx)
	c.ipvs(ctx)
	c.conntrack(ctx)
	c.kubeProxy(ctx)
	c.locks(ctx)
	c.processes(ctx)
	c.journal()
	if len(c.errs) > 0 {
		w.Abort()
		return 0, fmt.Errorf("bundle: %w", errors.Join(c.errs...))
	}
	parts := len(w.Manifest().Parts)
	if err := w.Close(); err != nil {
		return 0, fmt.Errorf("bundle: %w", err)
	}
	return parts, nil
}

// run runs a command with a deadline and returns its output, bounded.
func (c *collector) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	if _, err := exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("%s not installed: %w", name, err)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.WaitDelay = time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &bundle.CapWriter{B: &out, N: int64(c.partMax) + 1}, &bundle.CapWriter{B: &errb, N: 4096}
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(errb.String()))
	}
	return out.Bytes(), err
}

func (c *collector) versions(ctx context.Context) {
	var b strings.Builder
	fmt.Fprintf(&b, "remediate %s (%s, %s/%s)\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		fmt.Fprintf(&b, "kernel %s %s %s\n", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:]))
	}
	for _, cmd := range [][]string{{"iptables", "--version"}, {"iptables-legacy", "--version"}, {"iptables-nft", "--version"}, {"nft", "--version"}} {
		out, err := c.run(ctx, cmd[0], cmd[1:]...)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", cmd[0], err)
			continue
		}
		fmt.Fprintf(&b, "%s: %s\n", cmd[0], strings.TrimSpace(string(out)))
	}
	c.add("versions.txt", "runtime, uname(2), `iptables --version` per backend, `nft --version` (not ipvsadm: it may load ip_vs)", []byte(b.String()), nil)
}

// iptablesSaves: each backend's and family's *-save output, as the
// IPTablesRules detector reads it (the save commands take no lock).
func (c *collector) iptablesSaves(ctx context.Context) {
	ipt := iptables.New(iptables.Config{})
	for _, b := range []iptables.Backend{iptables.Legacy, iptables.NFT} {
		for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
			name := iptables.SaveCommand(f, b)
			if why, ok := c.n.Unavailable["iptables"]; ok {
				c.add(name+".txt", name, nil, errors.New(why))
				continue
			}
			out, _, d, err := ipt.SaveRaw(ctx, f, b, c.partMax+1)
			c.add(name+".txt", fmt.Sprintf("%s (no -w: a save never takes the xtables lock; took %s)", name, d.Round(time.Millisecond)), out, err)
		}
	}
}

// nftTables: kube-proxy's own nftables tables (nftables mode), as text.
func (c *collector) nftTables(ctx context.Context) {
	for _, fam := range []string{"ip", "ip6"} {
		out, err := c.run(ctx, "nft", "list", "table", fam, "kube-proxy")
		c.add("nft-"+fam+"-kube-proxy.txt", "nft list table "+fam+" kube-proxy", out, err)
	}
}

// ipvs: virtual and real servers over netlink, and the connection table.
func (c *collector) ipvs(ctx context.Context) {
	if c.n.IPVS == nil {
		c.add("ipvs-services.txt", "netlink (IPVS)", nil, errors.New(c.n.Why("ipvs")))
		c.add("ipvs-connections.txt", "/proc/net/ip_vs_conn", nil, errors.New(c.n.Why("ipvs")))
		return
	}
	var b strings.Builder
	vss, err := c.n.IPVS.VirtualServers(ctx)
	for _, vs := range vss {
		fmt.Fprintf(&b, "%s %s\n", vs.Key(), vs.Scheduler)
		rss, rerr := c.n.IPVS.RealServers(ctx, vs)
		if rerr != nil {
			fmt.Fprintf(&b, "  error: %v\n", rerr)
		}
		for _, rs := range rss {
			fmt.Fprintf(&b, "  -> %s weight %d active %d inactive %d\n", rs.AddrPort(), rs.Weight, rs.ActiveConns, rs.InactiveConns)
		}
	}
	c.add("ipvs-services.txt", "netlink IPVS_CMD_GET_SERVICE / GET_DEST (like ipvsadm -Ln --stats)", []byte(b.String()), err)

	var cb strings.Builder
	count := 0
	errStop := errors.New("stop")
	err = c.n.IPVS.Connections(ctx, "", func(cn ipvs.Conn) error {
		if count++; count > maxIPVSConns || cb.Len() > c.partMax {
			return errStop
		}
		fmt.Fprintf(&cb, "%s %s -> %s -> %s %s expires %s\n", cn.Protocol, cn.Client, cn.Virtual, cn.Dest, cn.State, cn.Expires)
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
		fmt.Fprintf(&cb, "...[stopped after %d connections]\n", count-1)
	}
	c.add("ipvs-connections.txt", "/proc/net/ip_vs_conn (like ipvsadm -Lnc)", []byte(cb.String()), err)
}

// conntrack: the table's count and max and the per-CPU statistics summed
// (like conntrack -C and conntrack -S), over netlink and procfs.
func (c *collector) conntrack(ctx context.Context) {
	if c.n.Conntrack == nil {
		c.add("conntrack.json", "netlink (ctnetlink) and /proc/sys/net/netfilter", nil, errors.New(c.n.Why("conntrack")))
		return
	}
	type out struct {
		Usage any    `json:"usage,omitempty"`
		Stats any    `json:"stats,omitempty"`
		Max   uint64 `json:"nf_conntrack_max,omitempty"`
		Hash  uint64 `json:"hashsize,omitempty"`
	}
	var v out
	u, err1 := c.n.Conntrack.Usage(ctx)
	if err1 == nil {
		v.Usage = u
	}
	s, err2 := c.n.Conntrack.Stats(ctx)
	if err2 == nil {
		v.Stats = s
	}
	v.Max, _ = c.n.Conntrack.Max(ctx)
	v.Hash, _ = c.n.Conntrack.HashSize(ctx)
	c.addJSON("conntrack.json", "ctnetlink IPCTNL_MSG_CT_GET_STATS (count) and IPCTNL_MSG_CT_GET_STATS_CPU summed (like conntrack -C, -S); nf_conntrack_max, hashsize", v, errors.Join(err1, err2))
}

// kubeProxy: its metrics, healthz, proxyMode and configz, as served.
func (c *collector) kubeProxy(ctx context.Context) {
	kp := c.pol.KubeProxy
	for _, e := range []struct{ name, url string }{
		{"kube-proxy-metrics.txt", kp.MetricsURL},
		{"kube-proxy-healthz.txt", kp.HealthzURL},
		{"kube-proxy-proxyMode.txt", kp.ProxyModeURL},
		{"kube-proxy-configz.json", kubeproxy.ConfigzURL(kp.MetricsURL)},
	} {
		body, err := c.get(ctx, e.url)
		c.add(e.name, "GET "+e.url, body, err)
	}
}

// get reads one kube-proxy endpoint the way the detectors do (httpget: a
// redirect is refused and named, never followed; no proxy from the
// environment; bounded in time and size). A body over the part's cap is
// kept to just past it, for Add to cut and mark.
func (c *collector) get(ctx context.Context, url string) ([]byte, error) {
	status, body, err := httpget.Get(ctx, c.http, url, "", httpTimeout, int64(c.partMax)+1)
	if errors.Is(err, httpget.ErrTooLarge) {
		err = nil
	}
	if err == nil && status != http.StatusOK {
		err = fmt.Errorf("HTTP %d", status)
	}
	return body, err
}

// locks: /proc/locks as it is, and the xtables lock file's real holders
// and waiters (fdinfo), as XtablesLockContention reads them.
func (c *collector) locks(ctx context.Context) {
	raw, err := readBounded(filepath.Join(c.o.procRoot, "locks"), c.partMax+1)
	c.add("proc-locks.txt", filepath.Join(c.o.procRoot, "locks"), raw, err)
	if c.n.Procs == nil {
		c.add("xtables-lock.json", "/proc/locks and /proc/<pid>/fdinfo", nil, errors.New(c.n.Why("procs")))
		return
	}
	fl, err := c.n.Procs.FileLocks(ctx, c.o.xtablesLock)
	c.addJSON("xtables-lock.json", "holders and waiters of "+c.o.xtablesLock+" from /proc/locks and /proc/<pid>/fdinfo", fl, err)
}

// processes: the iptables, nft and kube-proxy processes with their ages
// and states (command lines redacted like every part; never environ).
func (c *collector) processes(ctx context.Context) {
	if c.n.Procs == nil {
		c.add("processes.json", "/proc/<pid>/stat, cmdline, exe", nil, errors.New(c.n.Why("procs")))
		return
	}
	ps, err := c.n.Procs.Find(ctx, bundleProcessNames)
	now := time.Now()
	type proc struct {
		Pid        int32    `json:"pid"`
		PPid       int32    `json:"ppid"`
		ParentName string   `json:"parentName"`
		Cmdline    []string `json:"cmdline"`
		Exe        string   `json:"exe,omitempty"`
		State      string   `json:"state"`
		AgeSeconds float64  `json:"ageSeconds"`
		Started    string   `json:"started"`
	}
	out := []proc{}
	for _, p := range ps {
		out = append(out, proc{Pid: p.Pid, PPid: p.PPid, ParentName: p.ParentName, Cmdline: p.Cmdline, Exe: p.Exe, State: p.State,
			AgeSeconds: p.Age(now).Round(time.Millisecond).Seconds(), Started: time.UnixMilli(p.CreateTimeMs).UTC().Format(time.RFC3339)})
	}
	c.addJSON("processes.json", "/proc/<pid>/stat, cmdline and exe of the iptables, ip6tables, nft and kube-proxy commands (never environ)", out, err)
}

// journal: the audit journal's last records.
func (c *collector) journal() {
	dir := c.o.stateDir
	if c.o.journalDir != "" {
		dir = c.o.journalDir // a dry run on a private copy of an unwritable state dir
	}
	tail, err := journalTailLines(dir, journalTail)
	var b strings.Builder
	for _, l := range tail {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	c.add("journal-tail.txt", fmt.Sprintf("the last %d records of %s", journalTail, filepath.Join(dir, "journal.jsonl")), []byte(b.String()), err)
}

// journalTailLines are the last n records of the journal in dir,
// formatted, oldest first: streamed, only n lines are held (a ring).
func journalTailLines(dir string, n int) ([]string, error) {
	tail := make([]string, 0, n)
	next := 0
	err := journal.Walk(dir, func(r journal.Record) error {
		if len(tail) < n {
			tail = append(tail, journal.Format(r))
		} else {
			tail[next] = journal.Format(r)
		}
		next = (next + 1) % n
		return nil
	})
	if len(tail) == n {
		tail = append(tail[next:], tail[:next]...)
	}
	return tail, err
}

// readBounded reads at most max bytes of a file.
func readBounded(path string, max int) ([]byte, error) {
	f, err := boundedfile.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, int64(max)))
}
