package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/sandbox"
)

// routesInput is what TestHostRoutes hands the probe (REMEDIATE_TEST_ROUTES).
type routesInput struct {
	// Secrets are host files outside every mount, by name: their content,
	// and a handle for open_by_handle_at (name_to_handle_at by the test).
	Secrets []routeSecret
	// CaplessPID is a uid-0 process with no capabilities.
	CaplessPID int
	// Planted is a symlink in the CNI configuration directory pointing to
	// the first secret through /proc/<CaplessPID>/root.
	Planted string
	// HostSysctl is a host kernel setting the daemon never writes
	// (written back with its own value).
	HostSysctl string
}

type routeSecret struct {
	Name, Path, Content string
	HandleType          int32
	Handle              string // hex
}

// routeResult is one access the probe tried: OK when it succeeded (for a
// read, when it returned the secret's content).
type routeResult struct {
	OK  bool
	Err string
}

// probeRoutes is the daemon as the pod runs it: the root command's flags
// parsed, restrictSelf applied as runMain applies it, then every known
// route to a host file outside the mounts tried, and the accesses the
// checks need. It prints the results as JSON.
func probeRoutes(in string, args []string) int {
	var ri routesInput
	if err := json.Unmarshal([]byte(in), &ri); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	o := &options{}
	cmd := &cobra.Command{}
	addRootFlags(cmd, o)
	if err := cmd.Flags().Parse(args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st := restrictSelf(o, zap.NewNop())
	res := map[string]routeResult{}
	try := func(name string, err error) { res[name] = routeResult{OK: err == nil, Err: errText(err)} }
	readIs := func(name, path, want string) {
		b, err := boundedfile.Read(path, 1<<20) // the daemon's own reader
		if err == nil && want != "" && string(b) != want {
			err = fmt.Errorf("read %d bytes, not the secret", len(b))
		}
		try(name, err)
	}
	pid := "/" + strconv.Itoa(ri.CaplessPID)
	for _, s := range ri.Secrets {
		h, _ := hex.DecodeString(s.Handle)
		try("open_by_handle_at "+s.Name, func() error {
			mfd, err := unix.Open(o.stateDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(mfd)
			fd, err := unix.OpenByHandleAt(mfd, unix.NewFileHandle(s.HandleType, h), unix.O_RDONLY|unix.O_CLOEXEC)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			b := make([]byte, 4096)
			n, err := unix.Read(fd, b)
			if err != nil {
				return err
			}
			if s.Content != "" && string(b[:n]) != s.Content {
				return fmt.Errorf("read %d bytes, not the secret", n)
			}
			return nil
		}())
		readIs("proc root "+s.Name, o.procRoot+pid+"/root"+s.Path, s.Content)
	}
	if len(ri.Secrets) > 0 {
		readIs("planted symlink", ri.Planted, ri.Secrets[0].Content)
	}
	try("write host sysctl", func() error {
		b, err := boundedfile.Read(ri.HostSysctl, 4096)
		if err != nil {
			return err
		}
		f, err := boundedfile.OpenWrite(ri.HostSysctl)
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}())
	// What the checks read and write must stay reachable.
	for _, f := range []string{"stat", "status", "cmdline", "cgroup"} {
		readIs("needed proc/<pid>/"+f, o.procRoot+pid+"/"+f, "")
	}
	// Reported, not judged: what else of another process the process
	// checks could use (those guarded by ptrace_may_access are refused to
	// a Landlock domain whatever the capabilities).
	for _, f := range []string{"schedstat", "wchan", "io", "environ", "net/tcp", "mountinfo"} {
		readIs("info proc/<pid>/"+f, o.procRoot+pid+"/"+f, "")
	}
	_, err := os.Readlink(o.procRoot + pid + "/ns/net")
	try("info proc/<pid>/ns/net readlink", err)
	_, err = os.Readlink(o.procRoot + pid + "/exe")
	try("info proc/<pid>/exe readlink", err)
	readIs("needed proc/locks", filepath.Join(o.procRoot, "locks"), "")
	readIs("needed proc/net/ip_tables_names", "/proc/net/ip_tables_names", "")
	readIs("needed nf_conntrack_max", filepath.Join(o.procRoot, "sys/net/netfilter/nf_conntrack_max"), "")
	try("needed nf_conntrack_max write", func() error { // RaiseConntrackMax's write, its own value back
		p := filepath.Join(o.procRoot, "sys/net/netfilter/nf_conntrack_max")
		b, err := boundedfile.Read(p, 64)
		if err != nil {
			return err
		}
		f, err := boundedfile.OpenWrite(p)
		if err != nil {
			return err
		}
		_, err = f.Write(b)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	}())
	try("needed state dir write", os.WriteFile(filepath.Join(o.stateDir, "probe"), []byte("x"), 0o600))
	_, err = os.ReadDir(o.cniConfDir)
	try("needed CNI dir list", err)
	out, _ := json.Marshal(struct {
		Landlock string
		Results  map[string]routeResult
	}{st.String(), res})
	fmt.Print(string(out))
	return 0
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// The routes to a host file outside the pod's mounts (issue 41, item 3).
var hostRoutes = []string{
	"open_by_handle_at planted", "proc root planted", "planted symlink", "write host sysctl",
}

// TestHostRoutes (issue 41, item 3) runs the daemon's start (flags parsed,
// restrictSelf as runMain calls it) with exactly the pod's capabilities
// (deploy/base/daemonset.yaml, checked here) and the pod's paths modelled
// as directories on the host's root filesystem (what a hostPath on it is:
// same superblock, so a handle works through any of them), then tries
// every known route to a host file outside them:
//
//   - open_by_handle_at of a host file's handle (name_to_handle_at here)
//     through the state directory;
//   - /proc/<pid>/root/<file> of a uid-0 process without capabilities,
//     started here (a host process or a root pod with few capabilities);
//   - a symlink planted in the CNI configuration directory pointing there,
//     read with the daemon's own reader (internal/boundedfile);
//   - writing a host kernel setting through the writable /proc (the chart
//     mounts the host's /proc rw for nf_conntrack_max: kernel.core_pattern
//     would be host code execution; the test writes printk_ratelimit back
//     with its own value).
//
// It fails if any route reaches the file, or if what the checks need
// (/proc/<pid>/{stat,status,cmdline,cgroup}, /proc/locks, /proc/net,
// nf_conntrack_max, the state and CNI directories) is refused. Controls
// show each route is real: with main's capabilities (DAC_READ_SEARCH) and
// without Landlock every route reads or writes (so the test fails on
// main's pod); Landlock alone refuses all four; dropping DAC_READ_SEARCH
// alone refuses only open_by_handle_at. The container's RuntimeDefault
// seccomp profile is not modelled: it allows open_by_handle_at whenever
// CAP_DAC_READ_SEARCH is granted, and blocks none of the other routes.
func TestHostRoutes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if abi, err := sandbox.ABI(); err != nil || abi < 1 {
		t.Skipf("no Landlock on this kernel (%v): the daemon runs unconfined here and says so", err)
	}
	checkPodCaps(t)
	dir, err := os.MkdirTemp("/var/tmp", "remediate-routes-") // not /tmp: the daemon's TMPDIR is allowed
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	p := func(s ...string) string { return filepath.Join(append([]string{dir}, s...)...) }
	for _, d := range []string{"secret", "state", "cni/net.d", "cni/bin", "cni/networks", "tmp", "policy"} {
		if err := os.MkdirAll(p(d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	secret := "host secret " + strconv.Itoa(os.Getpid())
	if err := os.WriteFile(p("secret", "shadow"), []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p("xtables.lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join("..", "..", "examples", "audit.yaml"), p("policy", "policy.yaml"), 0o644)

	capless := withCaps(t, "-all", "sleep", "600")
	if err := capless.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = capless.Process.Kill(); _ = capless.Wait() })
	in := routesInput{CaplessPID: capless.Process.Pid, HostSysctl: "/proc/sys/kernel/printk_ratelimit",
		Planted: p("cni", "net.d", "10-planted.conflist")}
	if err := os.Symlink(fmt.Sprintf("/proc/%d/root%s", in.CaplessPID, p("secret", "shadow")), in.Planted); err != nil {
		t.Fatal(err)
	}
	handle := func(name, path, content string) {
		h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, path, 0)
		if err != nil {
			t.Fatalf("name_to_handle_at %s: %v", path, err)
		}
		in.Secrets = append(in.Secrets, routeSecret{Name: name, Path: path, Content: content, HandleType: h.Type(), Handle: hex.EncodeToString(h.Bytes())})
	}
	handle("planted", p("secret", "shadow"), secret)
	if _, err := os.Stat("/etc/shadow"); err == nil {
		handle("/etc/shadow", "/etc/shadow", "")
	}
	b, _ := json.Marshal(in)
	args := []string{"--proc-root=/proc", "--sys-root=/sys", "--cgroup-root=/sys/fs/cgroup",
		"--state-dir=" + p("state"), "--xtables-lock=" + p("xtables.lock"), "--policy=" + p("policy", "policy.yaml"),
		"--cni-conf-dir=" + p("cni", "net.d"), "--cni-bin-dir=" + p("cni", "bin"), "--cni-ipam-dir=" + p("cni", "networks")}
	type result struct {
		Landlock string
		Results  map[string]routeResult
	}
	probe := func(caps string, extra ...string) result {
		t.Helper()
		cmd := withCaps(t, caps, os.Args[0], append(args, extra...)...)
		cmd.Env = append(os.Environ(), "REMEDIATE_TEST_ROUTES="+string(b), "TMPDIR="+p("tmp"), "KUBECONFIG="+p("kube", "none")) // not a parent of the secret: its directory is allowed
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var r result
		if err != nil || json.Unmarshal(out, &r) != nil {
			t.Fatalf("probe with %s %v: %v\n%s\n%s", caps, extra, err, out, stderr.String())
		}
		return r
	}

	pod := probe(podCaps)
	if !strings.HasPrefix(pod.Landlock, "landlock: enforced") {
		t.Errorf("the pod's daemon is not confined: %s", pod.Landlock)
	}
	for name, r := range pod.Results {
		if strings.HasPrefix(name, "info ") {
			continue
		}
		if strings.HasPrefix(name, "needed ") {
			if !r.OK && !strings.Contains(r.Err, "no such file") { // not there is not refused
				t.Errorf("%s: refused to the confined daemon: %s", name, r.Err)
			}
		} else if r.OK {
			t.Errorf("route %s reaches a host file outside the mounts (pod capabilities, %s)", name, pod.Landlock)
		}
	}
	for _, name := range hostRoutes {
		if _, ok := pod.Results[name]; !ok {
			t.Errorf("route %s was not tried", name)
		}
	}
	t.Logf("pod (%s, %s): %v", podCaps, pod.Landlock, pod.Results)

	// Controls: each route is real, and which change closes it.
	main := probe(mainPodCaps, "--no-landlock")
	for _, name := range hostRoutes {
		if r := main.Results[name]; !r.OK {
			t.Errorf("control: with main's capabilities and no Landlock, route %s is refused (%s): the probe does not show the route", name, r.Err)
		}
	}
	capsOnly := probe(podCaps, "--no-landlock")
	landlockOnly := probe(mainPodCaps)
	for _, name := range hostRoutes {
		if r := landlockOnly.Results[name]; r.OK {
			t.Errorf("control: Landlock with DAC_READ_SEARCH still lets %s through", name)
		}
		wantOK := name != "open_by_handle_at planted"
		if r := capsOnly.Results[name]; r.OK != wantOK {
			t.Errorf("control: without DAC_READ_SEARCH and without Landlock, %s ok=%v (%s), want %v", name, r.OK, r.Err, wantOK)
		}
	}
	t.Logf("main's pod (%s, no Landlock): %v", mainPodCaps, main.Results)
	for name, r := range pod.Results {
		if strings.HasPrefix(name, "info ") {
			t.Logf("%s of a capability-less root process: confined %v %s; unconfined (pod capabilities) %v %s", name, r.OK, r.Err, capsOnly.Results[name].OK, capsOnly.Results[name].Err)
		}
	}
	t.Logf("Landlock only (%s, %s): %v", mainPodCaps, landlockOnly.Landlock, landlockOnly.Results)
}

// checkPodCaps fails when the capabilities the tests use as the pod's are
// not deploy/base/daemonset.yaml's.
func checkPodCaps(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "deploy", "base", "daemonset.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						SecurityContext struct {
							Capabilities struct{ Drop, Add []string }
						} `yaml:"securityContext"`
					}
				}
			}
		}
	}
	if err := yaml.Unmarshal(b, &ds); err != nil || len(ds.Spec.Template.Spec.Containers) == 0 {
		t.Fatalf("deploy/base/daemonset.yaml: %v", err)
	}
	c := ds.Spec.Template.Spec.Containers[0].SecurityContext.Capabilities
	want := []string{"-all"}
	for _, a := range c.Add {
		want = append(want, "+"+strings.ToLower(a))
	}
	if !slices.Equal(c.Drop, []string{"ALL"}) || strings.Join(want, ",") != podCaps {
		t.Errorf("deploy/base/daemonset.yaml drops %v and adds %v; the tests' podCaps is %s", c.Drop, c.Add, podCaps)
	}
}
