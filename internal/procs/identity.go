package procs

import (
	"fmt"
	"path/filepath"
)

// GoMainPackages maps a program name (an executable's basename, a comm)
// to the main package path its real executable records in its Go build
// information. A parent that a policy requires by name (KillProcess's
// parents) and that is listed here must run an executable that says so:
// a copy of bash named kube-proxy has the name, the capability and the
// namespace, but no such build information.
var GoMainPackages = map[string]string{
	"kube-proxy": "k8s.io/kubernetes/cmd/kube-proxy",
}

// CheckProgram reports why p is not a real instance of the program name
// by its own facts (nil when it may be): it must run with CAP_NET_ADMIN in
// the network namespace whose key is selfNetKey (the node's: Process.NetKey,
// readable without ptrace). Where its executable is readable
// (CAP_SYS_PTRACE), a second opinion: the executable's basename must be
// name and, for a program in GoMainPackages, the Go build information of
// that executable (goMain, as Interface.GoMain reads it; goMainErr when it
// could not be read) must name the program's main package. argv[0] and
// comm are chosen by the process and are not evidence; nor is build
// information alone (whoever builds chooses it): whose process it is (its
// cgroup against the API, procident) is the caller's to establish.
func CheckProgram(p Process, name string, selfNetKey uint64, goMain string, goMainErr error) error {
	if p.CapEff&CapNetAdmin == 0 {
		return fmt.Errorf("it runs without CAP_NET_ADMIN (CapEff %016x)", p.CapEff)
	}
	if selfNetKey == 0 || p.NetKey != selfNetKey {
		return fmt.Errorf("it runs in another network namespace than the node's (net/dev inode %d, the node's %d)", p.NetKey, selfNetKey)
	}
	if p.Exe == "" {
		return nil
	}
	if base := filepath.Base(p.Exe); base != name {
		return fmt.Errorf("its executable %q is not %s", p.Exe, name)
	}
	if want, ok := GoMainPackages[name]; ok {
		if goMainErr != nil {
			return fmt.Errorf("its executable %q is not the Go program %s: %v", p.Exe, want, goMainErr)
		}
		if goMain != want {
			return fmt.Errorf("its executable %q is the Go program %q, not %s", p.Exe, goMain, want)
		}
	}
	return nil
}
