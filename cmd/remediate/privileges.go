package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/node"
)

// Capability bits (linux/capability.h).
const (
	capNetAdmin  = 12
	capSysPtrace = 19
)

// privileges are this process's effective capabilities that checks need,
// read once at start from /proc/self/status (our own process, whatever
// --proc-root is).
type privileges struct {
	uid       int
	known     bool // CapEff was readable
	netAdmin  bool // netlink (conntrack, IPVS), iptables-*-save
	sysPtrace bool // other processes' root filesystems (hostroot); exe, fds as a second opinion
}

func readPrivileges() privileges {
	p := privileges{uid: os.Geteuid()}
	f, err := boundedfile.OpenBounded("/proc/self/status", 64<<10)
	if err != nil {
		return p
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return p
		}
		p.known = true
		p.netAdmin = caps&(1<<capNetAdmin) != 0
		p.sysPtrace = caps&(1<<capSysPtrace) != 0
	}
	return p
}

// missing returns, per subsystem this process lacks the privilege for,
// the reason its checks are skipped.
func (p privileges) missing() map[string]string {
	if !p.known {
		return nil // cannot tell: let each check find out
	}
	who := fmt.Sprintf("running as uid %d", p.uid)
	out := map[string]string{}
	if !p.netAdmin {
		r := "needs root / CAP_NET_ADMIN (" + who + " without it)"
		out["conntrack"], out["iptables"], out["ipvs"], out["nftables"] = r, r, r, r
	}
	if !p.sysPtrace {
		// Without CAP_SYS_PTRACE the kernel refuses /proc/<pid>/exe, fd,
		// fdinfo, ns/net and root of every process with more capabilities
		// than this one (ptrace_may_access). The process checks and kills
		// do not need them (issue 41): identity comes from the cgroup
		// checked against the API, the network namespace from
		// /proc/<pid>/net/dev's inode, progress from /proc/<pid>/stat, the
		// lock holders from /proc/locks (internal/procs, procident); the
		// executable and fds are only a second opinion where readable.
		// What stays off is reading the host's and kube-proxy's files
		// through /proc/<pid>/root (deploy/README.md lists the checks).
		hint := " (" + who + " without it; the chart's sysPtrace: true or deploy/components/sys-ptrace grants it)"
		out[node.SubsystemHostRoot] = "needs CAP_SYS_PTRACE to read the host's and kube-proxy's files through /proc/<pid>/root" + hint
	}
	return out
}

// applyPrivileges turns the node's subsystems this process has no
// privilege for into unavailable ones, so their checks are skipped with
// the reason instead of failing every cycle as findings about remediate.
func applyPrivileges(n *node.Node, missing map[string]string) {
	for sub, why := range missing {
		switch sub {
		case "conntrack":
			n.Conntrack = nil
		case "iptables":
			n.IPTables = nil
		case "ipvs":
			n.IPVS = nil
		case "nftables":
			n.NFTables = nil
		case "procs":
			n.Procs = nil
		case node.SubsystemHostRoot:
			// No adapter: the detectors reading /proc/<pid>/root ask
			// n.Unavailable.
		default:
			continue
		}
		n.Unavailable[sub] = why
	}
}

// logPrivileges says once, at start, which checks are off for lack of
// privileges (without CAP_SYS_PTRACE: only those reading other
// processes' root filesystems; the process checks run).
func logPrivileges(log *zap.Logger, missing map[string]string) {
	if len(missing) == 0 {
		return
	}
	subs := make([]string, 0, len(missing))
	for s := range missing {
		subs = append(subs, s)
	}
	log.Warn("missing privileges: these subsystems' checks and actions are skipped", zap.Strings("subsystems", subs), zap.Any("reasons", missing))
}
