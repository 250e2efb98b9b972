package bundle

import (
	"bytes"
	"regexp"
)

// Redacted replaces a secret in a part.
const Redacted = "[REDACTED]"

// redactions are applied in order. They err on the side of removing: a
// bundle is handed on (tickets, chat), and kube-proxy's metrics, a
// process's command line or a kubeconfig path's content must not carry a
// credential with it.
//
// hints are lower-case strings one of which any match contains: a part
// without any skips the expression (a multi-megabyte *-save output is
// scanned once for the hints instead of once per expression).
var redactions = []struct {
	re    *regexp.Regexp
	repl  string
	hints []string
}{
	// PEM private keys, whole.
	{regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----`), Redacted, []string{"private key"}},
	// Authorization headers (any scheme), to the end of the line or
	// value.
	{regexp.MustCompile(`(?i)(authorization["']?\s*[:=]\s*["']?)[^\r\n"']+`), "${1}" + Redacted, []string{"authorization"}},
	// Bearer tokens anywhere.
	{regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9\-._~+/]+=*`), "${1}" + Redacted, []string{"bearer"}},
	// Credentials as key: value or key=value (kubeconfig's token,
	// client-key-data, password; --token=... on a command line; JSON).
	{regexp.MustCompile(`(?i)((?:token|password|passwd|secret|client-key-data|client-certificate-data|api-?key)["']?\s*[:=]\s*["']?)[^\s"',;}]+`), "${1}" + Redacted,
		[]string{"token", "passw", "secret", "client-key-data", "client-certificate-data", "apikey", "api-key"}},
	// JWTs (ServiceAccount tokens) wherever they appear.
	{regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`), Redacted, []string{"eyj"}},
}

// Redact returns data with secrets replaced by [REDACTED] and how many
// were replaced.
func Redact(data []byte) ([]byte, int) {
	n := 0
	lower := bytes.ToLower(data)
	for _, r := range redactions {
		if !containsAny(lower, r.hints) {
			continue
		}
		data = r.re.ReplaceAllFunc(data, func(m []byte) []byte {
			n++
			return r.re.ReplaceAll(m, []byte(r.repl))
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
