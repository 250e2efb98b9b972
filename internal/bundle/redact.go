package bundle

import (
	"bytes"
	"encoding/base64"
	"math"
	"regexp"
	"sort"
	"strings"
	"unicode/utf8"
)

// Redacted replaces a secret in a part.
const Redacted = "[REDACTED]"

// secretWords make a key, a flag or a label a credential's name (matched
// case-insensitively anywhere in it: --token, --bearer-token,
// client-secret, refresh-token, KUBE_PROXY_SECRET, api_key, --passphrase,
// --cookie).
const secretWords = `(?:token|password|passwd|passphrase|secret|client-key-data|client-certificate-data|api[-_]?key|credentials?|cookie)`

// secretHints are the lower-case strings of secretWords.
var secretHints = []string{"token", "passw", "passphrase", "secret", "client-key-data", "client-certificate-data", "apikey", "api-key", "api_key", "credential", "cookie"}

// valueEnd is what ends a credential's value on a command line, in JSON,
// a label or a header.
const valueEnd = `[^\s"',;}&]`

// redaction is one rule. Rules are shapes, not places: a name
// (key=value, --flag value, a header), a known token prefix (AKIA, ghp_,
// glpat-, sk_live_, xoxb-), a structure (JWT, PEM, URL userinfo, a query
// parameter), or what a value looks like (high entropy; base64 that
// decodes to one of the other shapes).
type redaction struct {
	// fn, if set, is the rule (a scan); re, repl, hints and keep are not
	// used.
	fn   func(data []byte) ([]byte, int)
	re   *regexp.Regexp
	repl string
	// hints are lower-case strings one of which any match contains: a
	// part without any skips the rule (a multi-megabyte *-save output is
	// scanned once for the hints instead of once per expression). A rule
	// without hints is always applied.
	hints []string
	// keep, if set, is asked about each match: true leaves it alone (a
	// -ptcp, a hex digest, a base64 run that decodes to nothing secret).
	keep func(m []byte) bool
}

// redactions are applied in order: the shapes, then the values. They err on the side of removing: a
// bundle is handed on (tickets, chat), and kube-proxy's metrics, a
// process's command line, a manifest's how or error must not carry a
// credential with it.
var redactions = append(append([]redaction{}, shapes...), values...)

// shapes are the rules by name, prefix and structure.
var shapes = []redaction{
	// PEM private keys, whole.
	{re: regexp.MustCompile(`-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----`), repl: Redacted, hints: []string{"private key"}},
	// PEM blocks base64-encoded once more (a kubeconfig's *-data fields,
	// a Secret's data): "-----BEGIN" is "LS0tLS1CRUdJT" in base64.
	{re: regexp.MustCompile(`LS0tLS1CRUdJT[A-Za-z0-9+/=]*`), repl: Redacted, hints: []string{"ls0tls1crudjt"}},
	// Authorization, Cookie and Set-Cookie headers, to the end of the
	// line or value (a Cookie header's several pairs included).
	{re: regexp.MustCompile(`(?i)((?:authorization|set-cookie|cookie)["']?\s*[:=]\s*["']?)[^\r\n"']+`), repl: "${1}" + Redacted, hints: []string{"authorization", "cookie"}},
	// Bearer tokens anywhere.
	{re: regexp.MustCompile(`(?i)(bearer\s+)[A-Za-z0-9\-._~+/]+=*`), repl: "${1}" + Redacted, hints: []string{"bearer"}},
	// URL userinfo anywhere (http://bob:Pa55w0rd@proxy, a metric's
	// host="https://admin:S3cret@apiserver", a git remote with a token):
	// whatever is between the scheme and the last '@' before the path
	// goes (a password may hold an '@').
	{re: regexp.MustCompile(`(?i)\b([a-z][a-z0-9+.-]*://)[^/\s"'<>\\]+@`), repl: "${1}" + Redacted + "@", hints: []string{"://"}},
	// Credentials in a URL's query: ?token=, &password=, Azure SAS sig=,
	// S3 X-Amz-Signature / X-Amz-Security-Token, OAuth code= and
	// client_secret=, key=. In JSON, '&' is written \u0026.
	{re: regexp.MustCompile(`(?i)((?:[?&;]|\\u0026)(?:sig|signature|x-amz-signature|x-amz-security-token|x-amz-credential|token|access_token|id_token|refresh_token|auth|password|passwd|pwd|pass|secret|client_secret|key|apikey|api_key|code|session|sessionid)=)[^&\s"'#<>\\]+`), repl: "${1}" + Redacted, hints: []string{"="}},
	// Credentials as key: value or key=value (kubeconfig's token,
	// client-key-data, password; --token=... on a command line; JSON).
	{re: regexp.MustCompile(`(?i)(` + secretWords + `["']?\s*[:=]\s*["']?)` + valueEnd + `+`), repl: "${1}" + Redacted, hints: secretHints},
	// A key's value: *_key=, *-key: (ssh_key=, encryption-key: ,
	// AWS_ACCESS_KEY=), not a path (--tls-private-key-file=/etc/...
	// names a file, the evidence).
	{re: regexp.MustCompile(`(?i)(\b[a-z0-9]+[_-]key(?:[_-]id)?["']?\s*[:=]\s*["']?)([^\s"',;}&/]` + valueEnd + `*)`), repl: "${1}" + Redacted, hints: []string{"key"}},
	// docker's config.json "auth" (base64 user:password) and
	// "identitytoken", also as a JSON string inside JSON (\"auth\").
	{re: regexp.MustCompile(`(?i)(\\?"(?:auth|identitytoken)\\?"\s*:\s*\\?")[^"\\]+`), repl: "${1}" + Redacted, hints: []string{`auth\"`, `auth"`, "identitytoken"}},
	// A secret-looking flag and its value as the next argument: "--token
	// S3CRET" on a command line, "--token", "S3CRET" in a JSON argv (one
	// or more spaces, a newline and indentation between them). A next
	// argument that is itself a flag is left alone.
	{re: regexp.MustCompile(`(?i)(\B--?[a-z0-9_.-]*` + secretWords + `[a-z0-9_.-]*(?:"\s*,\s*"|[ \t]+))([^\s"',;}\-]` + valueEnd + `*)`), repl: "${1}" + Redacted, hints: secretHints},
	// A secret-named identifier (snake case: an underscore next to the
	// word, so prose's "password authentication" stays) and its value as
	// the next word (aws configure set aws_secret_access_key VALUE).
	{re: regexp.MustCompile(`(?i)(\b[a-z0-9_]*(?:_(?:secret|password|passphrase)|(?:secret|password|passphrase)_)[a-z0-9_]*(?:"\s*,\s*"|[ \t]+))([^\s"',;}\-\[]` + valueEnd + `{5,})`), repl: "${1}" + Redacted, hints: []string{"secret", "passw", "passphrase"}},
	// JWTs (ServiceAccount tokens, OIDC id-tokens) wherever they appear.
	{re: regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`), repl: Redacted, hints: []string{"eyj"}},
}

// values are the rules by what a value looks like, written as scans
// (a regular expression per token over a multi-megabyte *-save output
// took seconds).
var values = []redaction{
	{fn: redactDashP},
	{fn: redactTokens},
}

// prefixed are known token prefixes: AWS access key IDs (AKIA, ASIA and
// the other four-letter kinds), GitHub (ghp_, gho_, ghu_, ghs_, ghr_,
// github_pat_), GitLab (glpat-, gldt-, glrt-...), Stripe (sk_live_,
// rk_live_, sk_test_...), Slack (xoxb-, xoxp-...), Google API keys (AIza),
// npm, PyPI, SendGrid, Twilio, HashiCorp Vault (hvs.).
var prefixed = regexp.MustCompile(`\b(?:(?:AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|ABIA|ACCA)[A-Z0-9]{16}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|gl(?:pat|dt|rt|cbt|ptt|ft|imt|agent|oas)-[A-Za-z0-9_-]{16,}|(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{10,}|xox[abposr]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35}|npm_[A-Za-z0-9]{36}|pypi-[A-Za-z0-9_-]{32,}|SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}|SK[0-9a-f]{32}|hv[sbr]\.[A-Za-z0-9_-]{20,})`)

// bootstrapToken is a kubeadm bootstrap token (abcdef.0123456789abcdef).
var bootstrapToken = regexp.MustCompile(`\b[a-z0-9]{6}\.[a-z0-9]{16}\b`)

// base64Runs returns the runs of tok of one base64 alphabet (standard
// [A-Za-z0-9+/] or URL-safe [A-Za-z0-9_-], then up to two '='), 16 bytes
// or more, leftmost first, the standard alphabet preferred: an nft chain
// name mixing '-' and '/' is neither.
func base64Runs(tok []byte) [][2]int {
	var runs [][2]int
	alnum := func(c byte) bool { return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' }
	span := func(p int, extra1, extra2 byte) int {
		e := p
		for e < len(tok) && (alnum(tok[e]) || tok[e] == extra1 || tok[e] == extra2) {
			e++
		}
		return e
	}
	for p := 0; p < len(tok); {
		e := span(p, '+', '/')
		if e-p < 16 {
			e = span(p, '_', '-')
		}
		if e-p < 16 {
			p++
			continue
		}
		for k := 0; k < 2 && e < len(tok) && tok[e] == '='; k++ {
			e++
		}
		runs = append(runs, [2]int{p, e})
		p = e
	}
	return runs
}

// prefixStarts are substrings one of which every prefixed token holds:
// tokens without any skip the expression.
var prefixStarts = [][]byte{[]byte("AKIA"), []byte("ASIA"), []byte("AGPA"), []byte("AIDA"), []byte("AROA"), []byte("AIPA"),
	[]byte("ANPA"), []byte("ANVA"), []byte("ABIA"), []byte("ACCA"), []byte("AIza"), []byte("gh"), []byte("gl"), []byte("_live_"), []byte("_test_"), []byte("xox"), []byte("npm_"),
	[]byte("pypi-"), []byte("SG."), []byte("SK"), []byte("hv")}

// tokenChar are the bytes of a token: both base64 alphabets, '=' and '.'
// (SendGrid's SG.x.y, Vault's hvs.x).
var tokenChar = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-=.") {
		t[c] = true
	}
	return t
}()

// redactTokens scans data for tokens of 16 or more bytes and replaces,
// in each, a kubeadm bootstrap token; a known token prefix's token
// (prefixed); base64 that decodes,
// once, to one of the shapes (a password= or a token wrapped in base64 on
// a command line or in a Secret's data); a high-entropy run (a random API
// key with no known prefix, an AWS secret access key on its own: 32 or
// more characters, mixed upper, lower and digits, near-random; hex
// digests, container IDs, UUIDs and words are not).
func redactTokens(data []byte) ([]byte, int) {
	var out []byte
	n, last := 0, 0
	for i := 0; i < len(data); {
		if !tokenChar[data[i]] {
			i++
			continue
		}
		start := i
		for i < len(data) && tokenChar[data[i]] {
			i++
		}
		if i-start < 16 {
			continue
		}
		for _, sp := range tokenSecrets(data[start:i]) {
			out = append(out, data[last:start+sp[0]]...)
			out = append(out, Redacted...)
			last = start + sp[1]
			n++
		}
	}
	if n == 0 {
		return data, 0
	}
	return append(out, data[last:]...), n
}

// tokenSecrets returns the ordered, disjoint spans of tok to redact.
func tokenSecrets(tok []byte) [][2]int {
	var spans [][2]int
	covered := func(a, b int) bool {
		for _, s := range spans {
			if a < s[1] && b > s[0] {
				return true
			}
		}
		return false
	}
	if len(tok) >= 23 && bytes.IndexByte(tok, '.') >= 0 {
		for _, m := range bootstrapToken.FindAllIndex(tok, -1) {
			spans = append(spans, [2]int{m[0], m[1]})
		}
	}
	for _, p := range prefixStarts {
		if bytes.Contains(tok, p) {
			for _, m := range prefixed.FindAllIndex(tok, -1) {
				if !covered(m[0], m[1]) {
					spans = append(spans, [2]int{m[0], m[1]})
				}
			}
			break
		}
	}
	for _, m := range base64Runs(tok) {
		run := tok[m[0]:m[1]]
		if covered(m[0], m[1]) || (len(run) < 32 || keepLowEntropy(run)) && keepBase64(run) {
			continue
		}
		spans = append(spans, [2]int{m[0], m[1]})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i][0] < spans[j][0] })
	return spans
}

// redactDashP replaces mysql's -pSECRET (a password stuck to the flag).
// Not iptables' -p tcp (a space), nor a -ptcp, -p6443 or a plain
// lower-case word (-print): keepDashP.
func redactDashP(data []byte) ([]byte, int) {
	var out []byte
	n, last := 0, 0
	for off := 0; ; {
		k := bytes.Index(data[off:], []byte("-p"))
		if k < 0 {
			break
		}
		at := off + k
		off = at + 2
		if at > 0 && !bytes.ContainsRune([]byte(" \t\n\"[,"), rune(data[at-1])) {
			continue
		}
		end := off
		for end < len(data) && !bytes.ContainsRune([]byte(" \t\r\n\f\v\"',;}&"), rune(data[end])) {
			end++
		}
		if end-off < 3 || keepDashP(data[off:end]) {
			continue
		}
		out = append(append(out, data[last:off]...), Redacted...)
		last, off = end, end
		n++
	}
	if n == 0 {
		return data, 0
	}
	return append(out, data[last:]...), n
}

// keepDashP keeps a -p argument that is no password: a protocol (any
// case), a port or a number, or a plain lower-case word (-print, -ptcp).
func keepDashP(v []byte) bool {
	lower, digitsOnly := true, true
	for _, c := range v {
		if c < 'a' || c > 'z' {
			lower = false
		}
		if (c < '0' || c > '9') && c != ':' && c != '.' && c != ',' && c != '-' && c != '/' {
			digitsOnly = false
		}
	}
	switch strings.ToLower(string(v)) {
	case "tcp", "udp", "sctp", "icmp", "icmpv6", "ipv6-icmp", "all", "esp", "ah", "gre", "udplite":
		return true // -pTCP
	}
	return lower || digitsOnly
}

// keepBase64 keeps a base64 run unless it decodes to printable text that
// holds a secret by one of the other rules (decoded once: the base64 and
// entropy rules are not applied to the decoded text).
func keepBase64(m []byte) bool {
	s := bytes.TrimRight(m, "=")
	if len(s)%4 == 1 {
		return true
	}
	var dec []byte
	for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
		d, err := enc.DecodeString(string(s))
		if err == nil {
			dec = d
			break
		}
	}
	if len(dec) < 8 || !printable(dec) {
		return true
	}
	_, n := redact(dec, shapes)
	return n == 0 && !prefixed.Match(dec) && !bootstrapToken.Match(dec)
}

// printable reports whether b is UTF-8 text without control characters
// other than whitespace.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, c := range b {
		if c < 0x20 && c != '\n' && c != '\t' && c != '\r' || c == 0x7f {
			return false
		}
	}
	return true
}

// keepLowEntropy keeps a long run that does not look random: without
// upper case, lower case and digits all present, hex (a digest, a
// container ID), mostly one class (a CamelCase identifier has few
// digits), or below 4 bits of Shannon entropy per character.
func keepLowEntropy(m []byte) bool {
	s := bytes.TrimRight(m, "=")
	var upper, lower, digit, hex int
	var freq [256]int
	for _, c := range s {
		freq[c]++
		switch {
		case c >= 'A' && c <= 'Z':
			upper++
		case c >= 'a' && c <= 'z':
			lower++
		case c >= '0' && c <= '9':
			digit++
		}
		if c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == '-' {
			hex++
		}
	}
	if upper == 0 || lower == 0 || digit == 0 || hex == len(s) || digit*20 < len(s) {
		return true
	}
	h := 0.0
	for _, f := range freq {
		if f > 0 {
			p := float64(f) / float64(len(s))
			h -= p * math.Log2(p)
		}
	}
	return h < 4.0
}

// Redact returns data with secrets replaced by [REDACTED] and how many
// were replaced.
func Redact(data []byte) ([]byte, int) { return redact(data, redactions) }

// RedactString is Redact for a string (a manifest's how or error).
func RedactString(s string) (string, int) {
	out, n := Redact([]byte(s))
	if n == 0 {
		return s, 0
	}
	return string(out), n
}

func redact(data []byte, rules []redaction) ([]byte, int) {
	n := 0
	lower := bytes.ToLower(data)
	for _, r := range rules {
		if r.fn != nil {
			var k int
			data, k = r.fn(data)
			n += k
			continue
		}
		if r.hints != nil && !containsAny(lower, r.hints) {
			continue
		}
		data = r.re.ReplaceAllFunc(data, func(m []byte) []byte {
			if r.keep != nil && r.keep(m) {
				return m
			}
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
