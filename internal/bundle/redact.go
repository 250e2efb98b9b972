package bundle

import (
	"bytes"
	"regexp"
)

// Redacted replaces a secret in a part.
const Redacted = "[REDACTED]"

// secretWords make a key, a flag or a label a credential's name (matched
// case-insensitively anywhere in it: --token, --bearer-token,
// client-secret, refresh-token, KUBE_PROXY_SECRET, api_key).
const secretWords = `(?:token|password|passwd|secret|client-key-data|client-certificate-data|api[-_]?key|credentials?)`

// secretHints are the lower-case strings of secretWords.
var secretHints = []string{"token", "passw", "secret", "client-key-data", "client-certificate-data", "apikey", "api-key", "api_key", "credential"}

// redactions are applied in order. They err on the side of removing: a
// bundle is handed on (tickets, chat), and kube-proxy's metrics, a
// process's command line or a kubeconfig path's content must not carry a
// credential with it.
//
// hints are lower-case strings one of which any match contains: a part
// without any skips the expression (a multi-megabyte *-save output is
// scanned once for the hints instead of once per expression). A rule
// without hints is always applied.
var redactions = []struct {
	re    *regexp.Regexp
	repl  string
	hints []string
}{
	// PEM private keys, whole.
	{regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----`), Redacted, []string{"private key"}},
	// PEM blocks base64-encoded once more (a kubeconfig's *-data fields,
	// a Secret's data): "-----BEGIN" is "LS0tLS1CRUdJT" in base64.
	{regexp.MustCompile(`LS0tLS1CRUdJT[A-Za-z0-9+/=]*`), Redacted, []string{"ls0tls1crudjt"}},
	// Authorization headers (any scheme), to the end of the line or
	// value.
	{regexp.MustCompile(`(?i)(authorization["']?\s*[:=]\s*["']?)[^\r\n"']+`), "${1}" + Redacted, []string{"authorization"}},
	// Bearer tokens anywhere.
	{regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9\-._~+/]+=*`), "${1}" + Redacted, []string{"bearer"}},
	// URL userinfo anywhere (http://bob:Pa55w0rd@proxy, a metric's
	// host="https://admin:S3cret@apiserver", a git remote with a token):
	// whatever is between the scheme and the last '@' before the path
	// goes (a password may hold an '@').
	{regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://)[^/\s"'<>\\]+@`), "${1}" + Redacted + "@", []string{"://"}},
	// Credentials as key: value or key=value (kubeconfig's token,
	// client-key-data, password; --token=... on a command line; JSON).
	{regexp.MustCompile(`(?i)(` + secretWords + `["']?\s*[:=]\s*["']?)[^\s"',;}]+`), "${1}" + Redacted, secretHints},
	// A secret-looking flag and its value as the next argument: "--token
	// S3CRET" on a command line, "--token", "S3CRET" in a JSON argv (one
	// or more spaces, a newline and indentation between them). A next
	// argument that is itself a flag is left alone.
	{regexp.MustCompile(`(?i)(\B--?[a-z0-9_.-]*` + secretWords + `[a-z0-9_.-]*(?:"\s*,\s*"|[ \t]+))([^\s"',;}\-][^\s"',;}]*)`), "${1}" + Redacted, secretHints},
	// JWTs (ServiceAccount tokens, OIDC id-tokens) wherever they appear.
	{regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`), Redacted, []string{"eyj"}},
	// kubeadm bootstrap tokens (abcdef.0123456789abcdef).
	{regexp.MustCompile(`\b[a-z0-9]{6}\.[a-z0-9]{16}\b`), Redacted, nil},
}

// Redact returns data with secrets replaced by [REDACTED] and how many
// were replaced.
func Redact(data []byte) ([]byte, int) {
	n := 0
	lower := bytes.ToLower(data)
	for _, r := range redactions {
		if r.hints != nil && !containsAny(lower, r.hints) {
			continue
		}
		data = r.re.ReplaceAllFunc(data, func(m []byte) []byte {
			out := r.re.ReplaceAll(m, []byte(r.repl))
			if !bytes.Equal(out, m) {
				n++
			}
			return out
		})
	}
	return data, n
}

func containsAny(b []byte, subs []string) bool {
	for _, s := range subs {
		if bytes.Contains(b, []byte(s)) {
			return true
		}
	}
	return false
}
