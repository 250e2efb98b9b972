package detect

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/remediate-dev/remediate/internal/kubeproxy"
)

// maxProcScan bounds the process directories read looking for kube-proxy.
const maxProcScan = 100000

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
// procRoot.
func processRunning(procRoot, name string) (bool, error) {
	d, err := os.Open(procRoot)
	if err != nil {
		return false, err
	}
	defer d.Close()
	names, err := d.Readdirnames(maxProcScan)
	if err != nil {
		return false, err
	}
	for _, n := range names {
		if n == "" || n[0] < '0' || n[0] > '9' {
			continue
		}
		comm, err := os.ReadFile(filepath.Join(procRoot, n, "comm"))
		if err == nil && string(bytes.TrimSpace(comm)) == name {
			return true, nil
		}
	}
	return false, nil
}
