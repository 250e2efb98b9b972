package main

import (
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/remediate-dev/remediate/internal/sandbox"
)

// restrictSelf confines the daemon's file access to the paths its flags
// name (internal/sandbox: Landlock), before it reads anything of the node,
// and returns what was done: logged once here, and said in the --once
// report (o.sandboxWarning) when not enforced for another reason than
// CAP_SYS_PTRACE. It never fails the run.
//
// Not applied with --no-landlock, nor when this process has CAP_SYS_PTRACE
// (the chart's sysPtrace: true): a Landlock domain refuses every ptrace
// access check towards processes outside it, whatever the capabilities,
// so the process checks that SYS_PTRACE was granted for (other processes'
// exe, fds, root) would be refused. With SYS_PTRACE the daemon reads the
// host's files through /proc/<pid>/root on purpose (deploy/README.md).
func restrictSelf(o *options, log *zap.Logger) sandbox.Status {
	switch {
	case o.noLandlock:
		st := sandbox.Status{Reason: "--no-landlock"}
		log.Warn(st.String())
		o.sandboxWarning = st.String()
		return st
	case readPrivileges().sysPtrace:
		// The operator's deliberate choice (sysPtrace: true), not news:
		// at debug, so a one-shot run stays the lines that matter.
		st := sandbox.Status{Reason: "CAP_SYS_PTRACE is granted: the process checks read other processes' exe, fds and root, which a Landlock domain refuses"}
		log.Debug(st.String())
		return st
	}
	kubeconfigs := filepath.SplitList(os.Getenv("KUBECONFIG"))
	if o.kubeconfig != "" {
		kubeconfigs = []string{o.kubeconfig}
	}
	rules := sandbox.Rules(sandbox.Config{
		ProcRoot: o.procRoot, HostRoot: o.hostRoot, SysRoot: o.sysRoot, CgroupRoot: o.cgroupRoot,
		CNIDirs: []string{o.cniConfDir, o.cniBinDir, o.cniIPAMDir}, PodLogDir: o.podLogDir, CRISocket: o.criSocket,
		StateDir: o.stateDir, JournalDir: o.journalDir, XtablesLock: o.xtablesLock, Policy: o.policy,
		Kubeconfig: kubeconfigs, KubeletCA: o.kubeletCA, Bundle: o.bundle, TempDir: os.TempDir(),
	})
	start := time.Now()
	st, err := sandbox.Apply(rules)
	took := time.Since(start)
	switch {
	case err != nil:
		log.Warn("landlock: not enforced: the daemon's file access is not confined", zap.Error(err))
		o.sandboxWarning = st.String()
	case !st.Enforced:
		log.Warn(st.String())
		o.sandboxWarning = st.String()
	default:
		log.Log(o.startupLevel, st.String(), zap.Strings("missing", st.Missing), zap.Duration("took", took))
	}
	return st
}
