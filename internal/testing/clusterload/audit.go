package clusterload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// AuditPolicy is the apiserver audit policy of `make bench-fleet`: every
// request at the Metadata level (who, verb, resource; no bodies), without
// the RequestReceived stage (a request is counted on ResponseComplete, a
// watch on ResponseStarted and closed on ResponseComplete).
const AuditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

// AuditArgs writes AuditPolicy into a temporary folder of tb and returns
// the kube-apiserver flags that log every request to a JSON audit log
// (controlplane.Options.ExtraAPIServerArgs), and that log's path.
func AuditArgs(tb testing.TB) (args []string, log string) {
	tb.Helper()
	dir := tb.TempDir()
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(AuditPolicy), 0o644); err != nil {
		tb.Fatal(err)
	}
	log = filepath.Join(dir, "audit.log")
	return []string{"--audit-policy-file", policy, "--audit-log-path", log, "--audit-log-format", "json", "--audit-log-maxbackup", "0"}, log
}

// auditEvent is the part of an audit.k8s.io/v1 Event the fleet benchmark
// reads.
type auditEvent struct {
	AuditID   string   `json:"auditID"`
	Stage     string   `json:"stage"`
	Verb      string   `json:"verb"`
	SourceIPs []string `json:"sourceIPs"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ImpersonatedUser *struct {
		Username string              `json:"username"`
		Extra    map[string][]string `json:"extra"`
	} `json:"impersonatedUser"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	RequestURI     string `json:"requestURI"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
}

// Who is the client a request is counted for: the node (from the source
// address the harness gave that node's process) and its role ("daemon",
// "kube-proxy"), or Node "" for everything else (the harness, the
// apiserver's own loopback clients).
type Who struct{ Node, Role string }

// Key is one counted kind of request: a verb ("get", "list", "update",
// ...; a watch is counted when it starts) on a resource ("leases",
// "endpointslices", "pods/status", ...), and the HTTP status when it was
// an error (>= 400; else 0).
type Key struct {
	Verb, Resource string
	Code           int
}

// AuditTally counts an audit log's requests per client. Feed it the log
// as it grows (Read); Snapshot copies the counts so that two snapshots
// give a phase's requests. Lines that are not audit events are counted in
// Bad and otherwise ignored.
type AuditTally struct {
	// BySource maps a source IP to its client; an address not in it is
	// counted under Who{} (role "other").
	BySource map[string]Who
	// Requests counts completed requests and watch starts.
	Requests map[Who]map[Key]int
	// Events and Bad count the lines read and the lines that did not parse.
	Events, Bad int

	open   map[string]Who // auditID of an open watch -> its client
	offset int64          // bytes of the file consumed (whole lines)
}

// NewAuditTally returns an empty tally for the given sources.
func NewAuditTally(bySource map[string]Who) *AuditTally {
	return &AuditTally{BySource: bySource, Requests: map[Who]map[Key]int{}, open: map[string]Who{}}
}

// ReadFile consumes the lines of path added since the last call (a
// partial last line is left for the next call).
func (a *AuditTally) ReadFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("audit log: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(a.offset, io.SeekStart); err != nil {
		return fmt.Errorf("audit log seek: %w", err)
	}
	n, err := a.Read(f)
	a.offset += n
	return err
}

// Read consumes the complete lines of r and returns how many bytes they
// took.
func (a *AuditTally) Read(r io.Reader) (int64, error) {
	br := bufio.NewReaderSize(r, 1<<20)
	var used int64
	for {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			return used, nil // a partial line waits for the next call
		}
		if err != nil {
			return used, fmt.Errorf("audit log read: %w", err)
		}
		used += int64(len(line))
		a.Line(line)
	}
}

// Line counts one line of the log.
func (a *AuditTally) Line(line []byte) {
	var e auditEvent
	if err := json.Unmarshal(line, &e); err != nil || e.AuditID == "" || e.Stage == "" {
		a.Bad++
		return
	}
	a.Events++
	who := a.who(&e)
	switch {
	case e.Verb == "watch" && e.Stage == "ResponseStarted":
		// A refused watch (the apiserver writes ResponseStarted with its
		// error too) is counted once, when it completes.
		if code(&e) < 400 {
			a.open[e.AuditID] = who
			a.add(who, Key{Verb: "watch", Resource: resourceOf(&e)})
		}
	case e.Verb == "watch":
		if _, started := a.open[e.AuditID]; started {
			delete(a.open, e.AuditID) // ResponseComplete or Panic: closed
		} else if c := code(&e); c >= 400 {
			a.add(who, Key{Verb: "watch", Resource: resourceOf(&e), Code: c})
		}
	case e.Stage == "ResponseComplete" || e.Stage == "Panic":
		k := Key{Verb: e.Verb, Resource: resourceOf(&e)}
		if c := code(&e); c >= 400 {
			k.Code = c
		}
		a.add(who, k)
	}
}

func (a *AuditTally) add(who Who, k Key) {
	m := a.Requests[who]
	if m == nil {
		m = map[Key]int{}
		a.Requests[who] = m
	}
	m[k]++
}

// who is the event's client: by its first source address; a request the
// harness made as a node's daemon from elsewhere is still the daemon's
// when it impersonates the DaemonSet's ServiceAccount with a node name.
func (a *AuditTally) who(e *auditEvent) Who {
	if len(e.SourceIPs) > 0 {
		if w, ok := a.BySource[e.SourceIPs[0]]; ok {
			return w
		}
	}
	if iu := e.ImpersonatedUser; iu != nil && len(iu.Extra["authentication.kubernetes.io/node-name"]) == 1 {
		return Who{Node: iu.Extra["authentication.kubernetes.io/node-name"][0], Role: "daemon"}
	}
	return Who{Role: "other"}
}

func code(e *auditEvent) int {
	if e.ResponseStatus == nil {
		return 0
	}
	return e.ResponseStatus.Code
}

func resourceOf(e *auditEvent) string {
	if e.ObjectRef == nil {
		// Non-resource URLs (/healthz, /version, /apis discovery).
		p, _, _ := strings.Cut(e.RequestURI, "?")
		return p
	}
	if e.ObjectRef.Subresource != "" {
		return e.ObjectRef.Resource + "/" + e.ObjectRef.Subresource
	}
	return e.ObjectRef.Resource
}

// Open is the number of watches open now per client.
func (a *AuditTally) Open() map[Who]int {
	out := map[Who]int{}
	for _, w := range a.open {
		out[w]++
	}
	return out
}

// Snapshot copies the counts.
func (a *AuditTally) Snapshot() map[Who]map[Key]int {
	out := make(map[Who]map[Key]int, len(a.Requests))
	for w, m := range a.Requests {
		c := make(map[Key]int, len(m))
		for k, v := range m {
			c[k] = v
		}
		out[w] = c
	}
	return out
}

// Delta is after - before per client and kind (kinds at 0 left out).
func Delta(before, after map[Who]map[Key]int) map[Who]map[Key]int {
	out := map[Who]map[Key]int{}
	for w, m := range after {
		for k, v := range m {
			if d := v - before[w][k]; d != 0 {
				if out[w] == nil {
					out[w] = map[Key]int{}
				}
				out[w][k] = d
			}
		}
	}
	return out
}

// RoleSum adds up, per kind, the counts of every node's client of role.
func RoleSum(counts map[Who]map[Key]int, role string) (sum map[Key]int, nodes int) {
	sum = map[Key]int{}
	for w, m := range counts {
		if w.Role != role || w.Node == "" {
			continue
		}
		nodes++
		for k, v := range m {
			sum[k] += v
		}
	}
	return sum, nodes
}

// FormatKeys prints counts as "verb resource n" sorted by kind, scaled by
// f (for example per node and minute).
func FormatKeys(m map[Key]int, f float64) string {
	keys := make([]Key, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Verb != keys[j].Verb {
			return keys[i].Verb < keys[j].Verb
		}
		return keys[i].Resource < keys[j].Resource
	})
	var b []string
	for _, k := range keys {
		code := ""
		if k.Code != 0 {
			code = fmt.Sprintf(" (HTTP %d)", k.Code)
		}
		b = append(b, fmt.Sprintf("%s %s%s %.2f", k.Verb, k.Resource, code, float64(m[k])*f))
	}
	if len(b) == 0 {
		return "none"
	}
	return strings.Join(b, ", ")
}
