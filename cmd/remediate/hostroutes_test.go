package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/remediate-dev/remediate/internal/boundedfile"
	"github.com/remediate-dev/remediate/internal/netnstest"
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

// counters are the packet and byte counters of a save or an nft listing.
var counters = regexp.MustCompile(`\[\d+:\d+\]|packets \d+ bytes \d+`)

// TestConfinedChildrenWork: the children the confined daemon runs
// (iptables-legacy-save, iptables-nft-save, nft, conntrack's netlink, the
// versions) inherit its Landlock domain and still give the same answers.
// The real binary, the pod's capabilities, in a network namespace with
// rules in all three backends, --once --dry-run --bundle over
// examples/audit.yaml, confined and with --no-landlock: the saves, nft
// tables and versions in the bundles are the same (but for their
// timestamps), and so are the report's findings, skipped and passed
// checks. It fails when a rule a child needs is missing (without the /usr
// and /sbin rules every save is an error).
func TestConfinedChildrenWork(t *testing.T) {
	netnstest.NeedRoot(t, "network namespaces and setpriv")
	netnstest.NeedCommands(t, "iptables-legacy", "iptables-nft", "nft")
	if abi, err := sandbox.ABI(); err != nil || abi < 1 {
		t.Skipf("no Landlock on this kernel: %v", err)
	}
	ns := netnstest.New(t)
	netnstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-N", "KUBE-SERVICES")
	netnstest.Run(t, ns, "", "iptables-legacy", "-t", "nat", "-A", "KUBE-SERVICES", "-p", "tcp", "-d", "10.96.0.1/32", "--dport", "443",
		"-m", "comment", "--comment", "default/kubernetes:https", "-j", "ACCEPT")
	netnstest.Run(t, ns, "", "iptables-nft", "-N", "KUBE-FIREWALL")
	netnstest.Run(t, ns, "", "iptables-nft", "-A", "KUBE-FIREWALL", "-p", "udp", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
	netnstest.Run(t, ns, "table ip kube-proxy {\n chain services {\n  ip daddr 10.96.0.10 udp dport 53 counter accept\n }\n}\n", "nft", "-f", "-")

	dir := t.TempDir()
	bin := filepath.Join(dir, "remediate")
	copyFile(t, os.Args[0], bin, 0o755)
	pol, err := filepath.Abs(filepath.Join("..", "..", "examples", "audit.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type report struct {
		Findings []struct{ Rule, Message string }
		Skipped  []struct{ Rule, Reason string }
		OK       []struct{ Rule, Judged string } `json:"ok"`
		Warnings []string
	}
	run := func(name string, extra ...string) (report, map[string]string) {
		t.Helper()
		bundle := filepath.Join(dir, name+".tar.gz")
		args := append([]string{"--once", "--sample", "0", "--dry-run", "-o", "json", "--policy", pol, "--state-dir", t.TempDir(),
			"--node-name", "n1", "--xtables-lock", filepath.Join(dir, "xtables.lock"), "--bundle", bundle,
			"--cni-conf-dir", dir, "--cni-bin-dir", dir, "--cni-ipam-dir", dir,
			// The confinement's start-up line is at debug in a one-shot run.
			"--log-level", "debug"}, extra...)
		cmd := withCaps(t, podCaps, bin, args...)
		cmd.Args = append(netnstest.Prefix(ns), cmd.Args...)
		cmd.Path, _ = exec.LookPath("ip")
		cmd.Env = append(os.Environ(), "REMEDIATE_TEST_AS_MAIN=1", "KUBECONFIG="+filepath.Join(dir, "none"))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); err != nil && (!ok || (ee.ExitCode() != exitOK && ee.ExitCode() != exitFindings)) {
			t.Fatalf("%s: %v\n%s\n%s", name, err, out, stderr.String())
		}
		var rep report
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("%s: %v\n%s", name, err, out)
		}
		if name == "confined" && !strings.Contains(stderr.String(), "landlock: enforced") {
			t.Errorf("the daemon did not confine itself:\n%s", stderr.String())
		}
		parts := map[string]string{}
		x := filepath.Join(dir, name)
		if err := os.MkdirAll(x, 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("tar", "-C", x, "-xzf", bundle).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, f := range []string{"iptables-legacy-save.txt", "iptables-nft-save.txt", "ip6tables-legacy-save.txt", "nft-ip-kube-proxy.txt", "versions.txt"} {
			b, err := os.ReadFile(filepath.Join(x, f))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var keep []string
			for _, l := range strings.Split(string(b), "\n") {
				if !strings.HasPrefix(l, "# Generated by") && !strings.HasPrefix(l, "# Completed on") {
					keep = append(keep, l)
				}
			}
			parts[f] = counters.ReplaceAllString(strings.Join(keep, "\n"), "") // the daemon's own probes count
		}
		return rep, parts
	}
	confined, cparts := run("confined")
	open, oparts := run("unconfined", "--no-landlock")
	for f, c := range cparts {
		if c != oparts[f] {
			t.Errorf("%s differs: confined\n%s\nunconfined\n%s", f, c, oparts[f])
		}
	}
	if !strings.Contains(cparts["iptables-legacy-save.txt"], "default/kubernetes:https") || !strings.Contains(cparts["nft-ip-kube-proxy.txt"], "10.96.0.10") ||
		!strings.Contains(cparts["iptables-nft-save.txt"], "KUBE-FIREWALL") {
		t.Errorf("the confined saves miss the namespace's rules: %v", cparts)
	}
	cj, _ := json.Marshal([]any{confined.Findings, confined.Skipped, confined.OK})
	oj, _ := json.Marshal([]any{open.Findings, open.Skipped, open.OK})
	// The two runs are a second or so apart: times in the texts (such as
	// "modules read at 2026-11-29T07:36:26Z") are not what is compared.
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z`)
	cj, oj = stamp.ReplaceAll(cj, []byte("<time>")), stamp.ReplaceAll(oj, []byte("<time>"))
	if string(cj) != string(oj) {
		t.Errorf("the reports differ:\nconfined   %s\nunconfined %s", cj, oj)
	}
	if len(confined.Warnings) != 0 || !slices.Contains(open.Warnings, "landlock: not enforced: --no-landlock") {
		t.Errorf("report warnings: confined %v, unconfined %v; want none, and the unconfined run said", confined.Warnings, open.Warnings)
	}
	t.Logf("confined: %d findings, %d skipped, %d ok, the same as unconfined; warnings %v / %v", len(confined.Findings), len(confined.Skipped), len(confined.OK), confined.Warnings, open.Warnings)
}
