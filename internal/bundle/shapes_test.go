package bundle

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// argvShape is one common shape of a secret on a process's command line
// (issue 38: 19 of 38 survived redaction on main) with the secret that
// must not survive.
type argvShape struct {
	shape, secret string
	argv          []string
	// line is argv joined by spaces, as the report and journal quote it.
	line string
}

// argvShapes are testdata/argv-shapes.tsv (cmd/remediate's end-to-end
// test plants the same lines in a real process).
var argvShapes = func() []argvShape {
	b, err := os.ReadFile("testdata/argv-shapes.tsv")
	if err != nil {
		panic(err)
	}
	var out []argvShape
	for _, l := range strings.Split(string(b), "\n") {
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Split(l, "\t")
		if len(f) != 3 {
			panic("argv-shapes.tsv: " + l)
		}
		c := argvShape{shape: f[0], secret: f[1]}
		if err := json.Unmarshal([]byte(f[2]), &c.argv); err != nil {
			panic(err)
		}
		c.line = strings.Join(c.argv, " ")
		out = append(out, c)
	}
	return out
}()

// argvKeep is what must survive redaction: a node's ordinary command
// lines, rules, paths, IPs and digests.
var argvKeep = []string{
	`kube-proxy --cluster-cidr=10.244.0.0/16 --proxy-mode=iptables --conntrack-max-per-core=0 --iptables-sync-period=30s --oom-score-adj=-999 --config=/var/lib/kube-proxy/config.conf --hostname-override=node-1 --masquerade-all --kubeconfig=/var/lib/kube-proxy/kubeconfig`,
	`kube-apiserver --tls-private-key-file=/etc/kubernetes/pki/apiserver.key --service-account-key-file=/etc/kubernetes/pki/sa.pub`,
	`iptables -t nat -A KUBE-SERVICES -p tcp -d 10.96.0.1/32 -m comment --comment "default/kubernetes:https cluster IP" --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y`,
	`ip6tables -w -ptcp --dport 53 -j ACCEPT`, `iptables -pUDP --dport 53`,
	`ssh -p2222 node-1`, `find /var/lib -print`, `ipvsadm -A -t 10.96.0.10:53 -s rr -p 300`,
	`containerd://3f4e5d6c7b8a99887766554433221100ffeeddccbbaa99887766554433221100`,
	`pod 0a1b2c3d-4e5f-6789-abcd-ef0123456789`,
	`sha256:8cb2de97839780a412b93877f8507ad6c94f73add17d5d7058e91741c9d5ec78`,
	`registry.k8s.io/kube-proxy:v1.34.4@sha256:2b7a1cd4e5f60718293a4b5c6d7e8f9012345678`,
	`/var/lib/kubelet/pods/0a1b2c3d-4e5f-6789-abcd-ef0123456789/volumes/kubernetes.io~projected/kube-api-access-x7k2p`,
	`chain endpoint-5OJB2KTY-default/kubernetes/tcp/https__10.200.0.1/6443 {`,
	`password authentication failed; the secret values are redacted; monkey keyboard passage`,
	`KubeProxyDataplaneHealthy XtablesLockContention IPTablesRules fd00:10:96::1 go1.23.4`,
	`xtables-nft-multi iptables-nft-restore --noflush --counters`,
	`kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.001"} 3`,
}

// Every shape redacted as a text line and as the JSON argv of
// processes.json; the ordinary lines around them survive. 25 of these
// lines kept their secret on main.
func TestArgvShapesRedacted(t *testing.T) {
	for _, c := range argvShapes {
		argv, _ := json.MarshalIndent(map[string]any{"cmdline": c.argv}, "", "  ")
		for form, in := range map[string]string{"text": c.line, "json argv": string(argv)} {
			out, n := Redact([]byte(in))
			if bytes.Contains(out, []byte(c.secret)) || n == 0 {
				t.Errorf("%s (%s): %q survives (%d redactions):\n%s", c.shape, form, c.secret, n, out)
			}
		}
	}
	for _, k := range argvKeep {
		argv, _ := json.Marshal(shellFields(k))
		for _, in := range []string{k, string(argv)} {
			if out, n := Redact([]byte(in)); n != 0 || string(out) != in {
				t.Errorf("ordinary line redacted:\n%s\n%s", in, out)
			}
		}
	}
}

// shellFields splits a command line into its argv the way a shell would
// for the lines of argvKeep: words, '...' and "..." grouping (quotes removed).
func shellFields(line string) []string {
	var out []string
	var cur strings.Builder
	in, quote := false, byte(0)
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case quote != 0 && c == quote:
			quote = 0
		case quote != 0:
			cur.WriteByte(c)
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == ' ' || c == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteByte(c)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// What kube-proxy, the kernel and the kubelet really print (the
// repository's captured outputs: metrics, healthz, iptables-save, nft
// rulesets as text and JSON, IPVS, /proc/locks, kubelet metrics, CNI
// agents' saves) has no secret: redaction leaves it byte for byte.
func TestRedactKeepsRealOutputs(t *testing.T) {
	var files []string
	for _, g := range []string{"../../internal/*/testdata/*", "../../detect/testdata/*", "../../detect/testdata/*/*"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	read := 0
	for _, f := range files {
		if strings.HasPrefix(f, "../../internal/bundle/") {
			continue // the planted secrets
		}
		st, err := os.Stat(f)
		if err != nil || !st.Mode().IsRegular() || st.Size() > 8<<20 {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		read++
		if out, n := Redact(b); n != 0 {
			for _, l := range strings.Split(string(out), "\n") {
				if strings.Contains(l, Redacted) {
					t.Errorf("%s: %q", f, l)
					break
				}
			}
		}
	}
	if read < 20 {
		t.Errorf("only %d captured outputs found", read)
	}
}
