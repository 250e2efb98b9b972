package bundle

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// argvShapes are the common shapes of a secret on a process's command
// line (issue 38: 19 of 38 survived redaction on main), each a command
// line with the secret that must not survive. TestArgvShapesRedacted
// tries each as text (report, journal) and as the JSON argv of
// processes.json.
var argvShapes = []struct{ shape, line, secret string }{
	// Held on main.
	{"--token=", `kube-proxy --token=S3cr3tTok3nAaa --v=2`, "S3cr3tTok3nAaa"},
	{"--token VALUE", `kube-proxy --token S3cr3tTok3nBbb --v=2`, "S3cr3tTok3nBbb"},
	{"--password=", `mysqladmin --password=Hunter2Pass status`, "Hunter2Pass"},
	{"--db-password VALUE", `app --db-password Hunter2Db`, "Hunter2Db"},
	{"Authorization: Bearer", `curl -H "Authorization: Bearer abcBearerTok123" http://10.0.0.1`, "abcBearerTok123"},
	{"Authorization: Basic", `curl -H "Authorization: Basic YWxpY2U6V29uZGVybGFuZA==" http://x`, "YWxpY2U6V29uZGVybGFuZA"},
	{"URL userinfo", `git clone https://alice:GitPassw0rd@git.example.com/r.git`, "GitPassw0rd"},
	{"--client-secret=", `oidc --client-secret=ClientS3cret99`, "ClientS3cret99"},
	{"--api-key=", `app --api-key=ApiK3yValue77`, "ApiK3yValue77"},
	{"--apikey VALUE", `app --apikey ApiK3yValue88`, "ApiK3yValue88"},
	{"ENV_TOKEN=", `sh -c API_TOKEN=envTok3nValue`, "envTok3nValue"},
	{"--refresh-token=", `app --refresh-token=RefreshTok99`, "RefreshTok99"},
	{"JWT", `app eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW0ifQ.c2lnbmF0dXJlLWFyZ3Y`, "eyJzdWIiOiJzeXN0ZW0ifQ"},
	{"kubeadm bootstrap token", `kubeadm join 10.0.0.1:6443 --token abcdef.0123456789abcdef`, "0123456789abcdef"},
	{"--credentials=", `app --credentials=CredS3cret`, "CredS3cret"},
	{"--secret=", `app --secret=TopS3cret1`, "TopS3cret1"},
	{"ENV_PASSWORD=", `env DB_PASSWORD=PwdValue42 app`, "PwdValue42"},
	{"?token=", `curl http://10.0.0.1:8080/api?token=QueryTok3n9`, "QueryTok3n9"},
	{"PEM in argv", `app --tls-key "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBgkq-----END PRIVATE KEY-----"`, "MIIEvQIBADANBgkq"},
	// Survived on main.
	{"AWS access key ID (AKIA)", `env AWS_ACCESS_KEY_ID=AKIA2E0A8F3B244C9986 aws s3 ls`, "AKIA2E0A8F3B244C9986"},
	{"AWS temporary key ID (ASIA)", `backup --key-id ASIAY34FZKBOKMUTVV7A`, "ASIAY34FZKBOKMUTVV7A"},
	{"AWS secret key after its name", `aws configure set aws_secret_access_key wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY`, "wJalrXUtnFEMI/K7MDENG"},
	{"*_key=", `app ssh_key=SshK3yMaterial9`, "SshK3yMaterial9"},
	{"*-key:", `app encryption-key:EncK3yValue1`, "EncK3yValue1"},
	{"passphrase=", `openssl enc passphrase=CorrectHorse7`, "CorrectHorse7"},
	{"--passphrase VALUE", `gpg --batch --passphrase Battery9Staple`, "Battery9Staple"},
	{"mysql -pSECRET", `mysql -uroot -pMyS3cretPw db`, "MyS3cretPw"},
	{"GitHub ghp_", `gh auth login --with-token ghp_16C7e42F292c6912E7710c838347Ae178B4a`, "ghp_16C7e42F292c6912E7710c838347Ae178B4a"},
	{"GitHub gho_", `app gho_16C7e42F292c6912E7710c838347Ae178B4b`, "gho_16C7e42F292c6912E7710c838347Ae178B4b"},
	{"GitHub ghs_", `app ghs_16C7e42F292c6912E7710c838347Ae178B4c`, "ghs_16C7e42F292c6912E7710c838347Ae178B4c"},
	{"GitHub github_pat_", `app github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEF`, "github_pat_11ABCDEFG0123456789"},
	{"GitLab glpat-", `glab --gl glpat-xY9zAbCdEfGh12345678`, "glpat-xY9zAbCdEfGh12345678"},
	{"Stripe sk_live_", `billing sk_live_4eC39HqLyjWDarjtT1zdp7dc`, "sk_live_4eC39HqLyjWDarjtT1zdp7dc"},
	{"Stripe rk_live_", `billing rk_live_4eC39HqLyjWDarjtT1zdp7dd`, "rk_live_4eC39HqLyjWDarjtT1zdp7dd"},
	{"Slack xoxb-", `notify xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx`, "AbCdEfGhIjKlMnOpQrStUvWx"},
	{"docker auth", `docker --config-json '{"auths":{"r.io":{"auth":"dXNlcjpwYXNzd29yZA=="}}}'`, "dXNlcjpwYXNzd29yZA"},
	{"Azure SAS sig=", `azcopy copy https://acct.blob.core.windows.net/c?sv=2020-08-04&ss=b&sig=abcDEF123%2Bxyz%3D .`, "abcDEF123%2Bxyz"},
	{"Cookie header", `curl -H "Cookie: session=SessC00kieVal; csrftoken=CsrfVal99" http://x`, "SessC00kieVal"},
	{"Cookie header, second pair", `curl -H "Cookie: a=b; csrftoken=CsrfVal98" http://x`, "CsrfVal98"},
	{"Set-Cookie", `printf Set-Cookie:id=SetC00kie42`, "SetC00kie42"},
	{"--cookie VALUE", `curl --cookie sid=CurlC00kie7 http://x`, "CurlC00kie7"},
	{"base64 of password=", `app --config cGFzc3dvcmQ9aHVudGVyMlNlY3JldA==`, "cGFzc3dvcmQ9aHVudGVyMlNlY3JldA"},
	{"base64 of an AWS key ID", `app --blob QUtJQUlPU0ZPRE5ON0VYQU1QTEY=`, "QUtJQUlPU0ZPRE5ON0VYQU1QTEY"},
	{"base64 of a docker config", `app --dockercfg eyJhdXRocyI6eyJyLmlvIjp7ImF1dGgiOiJkWE5sY2pwd1lYTnpkMjl5WkE9PSJ9fX0=`, "eyJhdXRocyI6eyJyLmlvIjp7ImF1dGgiOiJkWE5sY2pwd1lYTnpkMjl5WkE9PSJ9fX0"},
	{"high-entropy token", `app --opaque 7fG2kLm9QxR4vT8wZ1bN5cY3hJ6dP0sA`, "7fG2kLm9QxR4vT8wZ1bN5cY3hJ6dP0sA"},
	{"AWS secret key on its own", `s3sync wJalrXUtnFEMI/K7MDENG/bPxRfiCY8ZPLEKEY2`, "bPxRfiCY8ZPLEKEY2"},
}

// argvKeep is what must survive redaction: a node's ordinary command
// lines, rules, paths, IPs and digests.
var argvKeep = []string{
	`kube-proxy --cluster-cidr=10.244.0.0/16 --proxy-mode=iptables --conntrack-max-per-core=0 --iptables-sync-period=30s --oom-score-adj=-999 --config=/var/lib/kube-proxy/config.conf --hostname-override=node-1 --masquerade-all --kubeconfig=/var/lib/kube-proxy/kubeconfig`,
	`kube-apiserver --tls-private-key-file=/etc/kubernetes/pki/apiserver.key --service-account-key-file=/etc/kubernetes/pki/sa.pub`,
	`iptables -t nat -A KUBE-SERVICES -p tcp -d 10.96.0.1/32 -m comment --comment "default/kubernetes:https cluster IP" --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y`,
	`ip6tables -w -ptcp --dport 53 -j ACCEPT`,
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
		argv, _ := json.MarshalIndent(map[string]any{"cmdline": shellFields(c.line)}, "", "  ")
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
// for these lines: words, '...' and "..." grouping (quotes removed).
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
