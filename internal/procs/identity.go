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
// (nil when it is), by what the process cannot choose: its executable's
// basename must be name and, for a program in GoMainPackages, the Go build
// information of that executable (goMain, as Interface.GoMain reads it;
// goMainErr when it could not be read) must name the program's main
// package; it must run with CAP_NET_ADMIN in the network namespace netNS
// (the node's). argv[0] and comm are chosen by the process and are not
// evidence.
func CheckProgram(p Process, name, netNS, goMain string, goMainErr error) error {
	if p.Exe == "" {
		return fmt.Errorf("its executable is not readable through the proc root")
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
	if p.CapEff&CapNetAdmin == 0 {
		return fmt.Errorf("it runs without CAP_NET_ADMIN (CapEff %016x)", p.CapEff)
	}
	if netNS == "" || p.NetNS != netNS {
		return fmt.Errorf("it runs in network namespace %q, not the node's (%q)", p.NetNS, netNS)
	}
	return nil
}
