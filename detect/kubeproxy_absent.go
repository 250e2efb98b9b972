package detect

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
	"github.com/remediate-dev/remediate/internal/procs"
)

// kubeProxyAbsence says why kube-proxy is absent from this node, or ""
// when it may be present: absent means nothing listens on either endpoint
// (both refuse connections) and no process named kube-proxy runs in the
// PID namespace of procRoot. A kube-proxy that runs and does not answer,
// answers garbage or times out is present (a finding), and so is one this
// daemon cannot look for (no procRoot, unreadable).
func kubeProxyAbsence(procRoot string, merr, herr error) string {
	if procRoot == "" || !refused(merr) || !refused(herr) {
		return ""
	}
	running, err := processRunning(procRoot, "kube-proxy")
	if err != nil || running {
		return ""
	}
	var urls []string
	for _, e := range []error{merr, herr} {
		if ke, ok := kubeproxy.AsError(e); ok && ke.URL != "" {
			urls = append(urls, ke.URL)
		}
	}
	return fmt.Sprintf("kube-proxy is not running on this node (no kube-proxy process, nothing listening on %s)", strings.Join(urls, " or "))
}

func refused(err error) bool {
	return err != nil && errors.Is(err, syscall.ECONNREFUSED)
}

// processRunning reports whether a process whose comm is name exists under
// procRoot (from the cycle's shared scan of every process's comm).
func processRunning(procRoot, name string) (bool, error) {
	return procs.CommRunning(procRoot, name)
}
