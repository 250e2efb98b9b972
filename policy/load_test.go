package policy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type testDetectorParams struct {
	Threshold float64  `yaml:"threshold"`
	MinAge    Duration `yaml:"minAge"`
	Names     []string `yaml:"names"`
}

func (p *testDetectorParams) Validate() []FieldError {
	var out []FieldError
	if p.Threshold <= 0 || p.Threshold > 1 {
		out = append(out, FieldError{"threshold", "must be in (0, 1]"})
	}
	for i, n := range p.Names {
		if n == "" {
			out = append(out, FieldError{Field: "names[" + string(rune('0'+i)) + "]", Msg: "must not be empty"})
		}
	}
	return out
}

type testActionParams struct {
	Factor float64 `yaml:"factor"`
	Grace  Duration
}

func (p *testActionParams) Validate() []FieldError {
	if p.Factor <= 1 {
		return []FieldError{{"factor", "must be > 1"}}
	}
	return nil
}

type testCatalog struct{}

func (testCatalog) NewDetectorParams(t string) (any, bool) {
	switch t {
	case "Thing":
		return &testDetectorParams{Threshold: 0.8, MinAge: D(time.Minute)}, true
	case "NoParams":
		return &struct{}{}, true
	}
	return nil, false
}
func (testCatalog) NewActionParams(t string) (any, bool) {
	if t == "Raise" {
		return &testActionParams{Factor: 2}, true
	}
	return nil, false
}
func (testCatalog) DetectorTypes() []string { return []string{"NoParams", "Thing"} }
func (testCatalog) ActionTypes() []string   { return []string{"Raise"} }

const header = "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\n"

const minimalRule = `rules:
- name: r1
  detector: {type: Thing}
`

func TestParseValid(t *testing.T) {
	src := header + `mode: enforce
interval: 15s
guardrails: {maxActionsPerHour: 4}
rules:
- name: conntrack
  detector:
    type: Thing
    threshold: 0.9
    names: [a, b]
  for: 0s
  action: {type: Raise, factor: 1.5}
  cooldown: 1h
  rateLimit: {max: 1, per: 24h}
- name: report-only
  detector: {type: NoParams}
`
	p, err := Parse("p.yaml", []byte(src), testCatalog{})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if p.Mode != Enforce || p.Interval.Duration != 15*time.Second {
		t.Errorf("mode/interval = %v/%v", p.Mode, p.Interval)
	}
	// Defaults kept where unset.
	if p.Jitter != DefaultJitter || p.Guardrails.MaxTargetsPerCycle != DefaultMaxTargetsPerCycle || p.Guardrails.MaxActionsPerHour != 4 {
		t.Errorf("node defaults not applied: %+v %v", p.Guardrails, p.Jitter)
	}
	r := p.Rules[0]
	dp := r.Detector.Params.(*testDetectorParams)
	if dp.Threshold != 0.9 || dp.MinAge.Duration != time.Minute || len(dp.Names) != 2 {
		t.Errorf("detector params = %+v", dp)
	}
	if r.Action.Params.(*testActionParams).Factor != 1.5 {
		t.Errorf("action params = %+v", r.Action.Params)
	}
	if r.For.Duration != 0 || r.Cooldown.Duration != time.Hour || r.RateLimit.Max != 1 || r.MaxAttempts != DefaultMaxAttempts || r.VerifyAfter.Duration != DefaultVerifyAfter {
		t.Errorf("rule guardrails = %+v", r)
	}
	if p.Rules[1].Action != nil || p.Rules[1].For.Duration != DefaultFor {
		t.Errorf("rule 2 = %+v", p.Rules[1])
	}
	if p.Mode != Enforce {
		t.Fatal("mode")
	}
}

func TestDefaultModeIsAudit(t *testing.T) {
	p, err := Parse("p.yaml", []byte(header+minimalRule), testCatalog{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Mode != Audit {
		t.Fatalf("mode = %q, want audit", p.Mode)
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		name string
		src  string
		want []string // each must appear, in order, one per error
	}{
		{"empty", "", []string{"p.yaml: empty policy"}},
		{"syntax", "a: [", []string{"p.yaml:1:4: did not find expected node content"}},
		{"two documents", header + minimalRule + "---\na: 1\n", []string{"p.yaml:6:1: a policy file holds exactly one YAML document"}},
		{"not a mapping", "- a\n", []string{"p.yaml:1:1: must be a mapping"}},
		{"missing apiVersion", "kind: RemediationPolicy\n" + minimalRule, []string{"p.yaml:1:1: apiVersion: required"}},
		{"wrong apiVersion", "apiVersion: v9\nkind: RemediationPolicy\n" + minimalRule, []string{`p.yaml:1:13: apiVersion: unsupported version "v9"`}},
		{"wrong kind", "apiVersion: remediate.dev/v1alpha1\nkind: Pod\n" + minimalRule, []string{"p.yaml:2:7: kind: must be RemediationPolicy"}},
		{"unknown top field", header + "modes: audit\n" + minimalRule, []string{`p.yaml:3:1: modes: unknown field "modes" (valid: apiVersion, kind, mode,`}},
		{"bad mode", header + "mode: fix\n" + minimalRule, []string{`p.yaml:3:7: mode: must be audit or enforce, got "fix"`}},
		{"bad duration", header + "interval: soon\n" + minimalRule, []string{`p.yaml:3:11: interval: invalid duration "soon"`}},
		{"duration not scalar", header + "interval: [1]\n" + minimalRule, []string{`p.yaml:3:11: interval: must be a duration`}},
		{"short interval", header + "interval: 10ms\n" + minimalRule, []string{`p.yaml:3:11: interval: must be at least 1s`}},
		{"bad jitter", header + "jitter: 1.5\n" + minimalRule, []string{`p.yaml:3:9: jitter: must be in [0, 1)`}},
		{"jitter type", header + "jitter: lots\n" + minimalRule, []string{`p.yaml:3:9: jitter: must be a number, got "lots"`}},
		{"detector timeout", header + "interval: 5s\ndetectorTimeout: 10s\n" + minimalRule, []string{`p.yaml:4:18: detectorTimeout: must not exceed interval`}},
		{"interval below the default detector timeout", header + "interval: 5s\n" + minimalRule,
			[]string{`p.yaml:3:11: interval: 5s is shorter than detectorTimeout (not set: its default is 10s); set detectorTimeout to at most 5s, or a longer interval`}},
		{"detector timeout above the default interval", header + "detectorTimeout: 40s\n" + minimalRule,
			[]string{`p.yaml:3:18: detectorTimeout: must not exceed interval (not set: its default is 30s)`}},
		{"zero detector timeout", header + "detectorTimeout: 0\n" + minimalRule, []string{`p.yaml:3:18: detectorTimeout: must be > 0`}},
		{"action timeout", header + "actionTimeout: -1s\n" + minimalRule, []string{`p.yaml:3:16: actionTimeout: must be > 0`}},
		{"bad url", header + "kubeProxy: {metricsURL: 'ftp://x'}\n" + minimalRule, []string{`p.yaml:3:25: kubeProxy.metricsURL: must be an http(s) URL`}},
		{"sync period", header + "kubeProxy: {syncPeriod: 0s}\n" + minimalRule, []string{`p.yaml:3:25: kubeProxy.syncPeriod: must be > 0`}},
		{"scrape timeout", header + "kubeProxy: {scrapeTimeout: 0s}\n" + minimalRule, []string{`p.yaml:3:28: kubeProxy.scrapeTimeout: must be > 0`}},
		{"node guardrails", header + "guardrails: {maxActionsPerHour: 0, maxTargetsPerCycle: -1}\n" + minimalRule, []string{
			`p.yaml:3:33: guardrails.maxActionsPerHour: must be >= 1`,
			`p.yaml:3:56: guardrails.maxTargetsPerCycle: must be >= 1`}},
		{"cluster settings", header + "cluster: {namespace: Bad_NS, budgetSlots: 0, budgetTTL: 1s, stormMaxShare: 1.5, stormMinNodes: 0}\n" + minimalRule, []string{
			`p.yaml:3:22: cluster.namespace: must be a valid namespace name`,
			`p.yaml:3:43: cluster.budgetSlots: must be >= 1`,
			`p.yaml:3:57: cluster.budgetTTL: must be at least 10s`,
			`p.yaml:3:76: cluster.stormMaxShare: must be in (0, 1]`,
			`p.yaml:3:96: cluster.stormMinNodes: must be >= 1`}},
		{"NaN jitter", header + "jitter: .nan\n" + minimalRule, []string{`p.yaml:3:9: jitter: must be a finite number, got ".nan"`}},
		{"NaN storm share", header + "cluster: {stormMaxShare: .NaN}\n" + minimalRule, []string{`p.yaml:3:26: cluster.stormMaxShare: must be a finite number, got ".NaN"`}},
		{"Inf action param", header + "rules:\n- name: a\n  detector: {type: Thing}\n  action: {type: Raise, factor: .inf}\n", []string{`rules[0].action.factor: must be a finite number, got ".inf"`}},
		{"count overflow", header + "guardrails: {maxActionsPerHour: 99999999, maxTargetsPerCycle: 200000000}\n" + minimalRule, []string{
			`guardrails.maxActionsPerHour: must be at most 10000`,
			`guardrails.maxTargetsPerCycle: must be at most 100`}},
		{"durations bounded", header + "interval: 100000h\nactionTimeout: 2h\n" + minimalRule, []string{`interval: must be at most 24h`, `actionTimeout: must be at most 1h`}},
		{"duration products bounded", header + "kubeProxy: {syncPeriod: 2000000h}\ncluster: {budgetTTL: 2000000h}\n" + minimalRule, []string{
			`kubeProxy.syncPeriod: must be at most 24h`, `cluster.budgetTTL: must be at most 24h`}},
		{"int type", header + "guardrails: {maxActionsPerHour: many}\n" + minimalRule, []string{`p.yaml:3:33: guardrails.maxActionsPerHour: must be an integer, got "many"`}},
		{"no rules", header, []string{`p.yaml:1:1: rules: at least one rule is required`}},
		{"rules not list", header + "rules: {a: 1}\n", []string{`p.yaml:3:8: rules: must be a list`}},
		{"rule name missing", header + "rules:\n- detector: {type: Thing}\n", []string{`p.yaml:4:3: rules[0].name: required`}},
		{"rule name bad", header + "rules:\n- name: Bad_Name\n  detector: {type: Thing}\n", []string{`p.yaml:4:9: rules[0].name: must be lower-case`}},
		{"rule name dup", header + "rules:\n- name: a\n  detector: {type: Thing}\n- name: a\n  detector: {type: Thing}\n", []string{`p.yaml:6:9: rules[1].name: duplicate rule name (also rules[0])`}},
		{"detector missing", header + "rules:\n- name: a\n", []string{`p.yaml:4:3: rules[0].detector: required`}},
		{"detector not mapping", header + "rules:\n- name: a\n  detector: Thing\n", []string{`p.yaml:5:13: rules[0].detector: must be a mapping with a type`}},
		{"detector type missing", header + "rules:\n- name: a\n  detector: {threshold: 1}\n", []string{`p.yaml:5:13: rules[0].detector.type: required: the detector type (one of: NoParams, Thing)`}},
		{"unknown detector", header + "rules:\n- name: a\n  detector: {type: Nope}\n", []string{`p.yaml:5:20: rules[0].detector.type: unknown detector type "Nope" (known: NoParams, Thing)`}},
		{"unknown action", header + "rules:\n- name: a\n  detector: {type: Thing}\n  action: {type: Nope}\n", []string{`p.yaml:6:18: rules[0].action.type: unknown action type "Nope" (known: Raise)`}},
		{"unknown detector param", header + "rules:\n- name: a\n  detector: {type: Thing, thresh: 1}\n", []string{`p.yaml:5:27: rules[0].detector.thresh: unknown parameter for detector Thing "thresh" (valid: threshold, minAge, names)`}},
		{"param to no-param type", header + "rules:\n- name: a\n  detector: {type: NoParams, x: 1}\n", []string{`p.yaml:5:30: rules[0].detector.x: unknown parameter for detector NoParams "x" (it takes no parameters)`}},
		{"param type", header + "rules:\n- name: a\n  detector: {type: Thing, minAge: forever}\n", []string{`p.yaml:5:35: rules[0].detector.minAge: invalid duration "forever"`}},
		{"param validate", header + "rules:\n- name: a\n  detector: {type: Thing}\n  action:\n    type: Raise\n    factor: 0.5\n", []string{`p.yaml:8:13: rules[0].action.factor: must be > 1`}},
		{"param validate defaulted field", header + "rules:\n- name: a\n  detector: {type: Thing, threshold: 0}\n", []string{`p.yaml:5:38: rules[0].detector.threshold: must be in (0, 1]`}},
		{"param validate list elem", header + "rules:\n- name: a\n  detector: {type: Thing, names: [x, '']}\n", []string{`p.yaml:5:38: rules[0].detector.names[1]: must not be empty`}},
		{"duplicate key", header + "rules:\n- name: a\n  name: b\n  detector: {type: Thing}\n", []string{`p.yaml:5:3: rules[0].name: duplicate key`}},
		{"rule guardrails", header + "rules:\n- name: a\n  detector: {type: Thing}\n  for: -1s\n  cooldown: -1s\n  rateLimit: {max: 0, per: 0s}\n  maxAttempts: 0\n  verifyAfter: 48h\n", []string{
			`p.yaml:6:8: rules[0].for: must be >= 0`,
			`p.yaml:7:13: rules[0].cooldown: must be >= 0`,
			`p.yaml:8:20: rules[0].rateLimit.max: must be >= 1`,
			`p.yaml:8:28: rules[0].rateLimit.per: must be > 0`,
			`p.yaml:9:16: rules[0].maxAttempts: must be >= 1`,
			`p.yaml:10:16: rules[0].verifyAfter: must be at most 24h`}},
		{"negative verify", header + "rules:\n- name: a\n  detector: {type: Thing}\n  verifyAfter: -1s\n", []string{`p.yaml:6:16: rules[0].verifyAfter: must be >= 0`}},
		{"unknown rule field", header + "rules:\n- name: a\n  detector: {type: Thing}\n  cooldwn: 1m\n", []string{`p.yaml:6:3: rules[0].cooldwn: unknown field "cooldwn"`}},
		{"bool type", header + "rules:\n- name: a\n  detector: {type: Thing}\n  dryRun: maybe\n", []string{`p.yaml:6:11: rules[0].dryRun: must be true or false, got "maybe"`}},
		{"many errors at once", header + "mode: x\njitter: 2\nrules:\n- name: a\n  detector: {type: Nope}\n  action: {type: Raise, factor: 0}\n", []string{
			`p.yaml:3:7: mode`, `p.yaml:4:9: jitter`, `p.yaml:7:20: rules[0].detector.type: unknown detector type`, `p.yaml:8:33: rules[0].action.factor: must be > 1`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(tc.src), testCatalog{})
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			es := Errors(err)
			if len(es) != len(tc.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(es), len(tc.want), err)
			}
			for i, w := range tc.want {
				if !strings.Contains(es[i].Error(), w) {
					t.Errorf("error %d = %q, want it to contain %q", i, es[i].Error(), w)
				}
			}
		})
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	src := header + minimalRule + "  action: {type: Raise, factor: 3}\n"
	p, err := Parse("p.yaml", []byte(src), testCatalog{})
	if err != nil {
		t.Fatal(err)
	}
	out, err := Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"mode: audit", "interval: 30s", "maxActionsPerHour: 6", "type: Thing", "threshold: 0.8", "minAge: 1m0s", "type: Raise", "factor: 3", "cooldown: 15m0s"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("effective policy lacks %q:\n%s", want, out)
		}
	}
	p2, err := Parse("show.yaml", out, testCatalog{})
	if err != nil {
		t.Fatalf("effective policy does not parse back: %v\n%s", err, out)
	}
	out2, _ := Marshal(p2)
	if string(out) != string(out2) {
		t.Errorf("not a fixed point:\n%s\n---\n%s", out, out2)
	}
}

func TestDurationYAML(t *testing.T) {
	var d Duration
	if err := yaml.Unmarshal([]byte("0"), &d); err != nil || d.Duration != 0 {
		t.Fatal(err, d)
	}
	if err := yaml.Unmarshal([]byte("1h30m"), &d); err != nil || d.Duration != 90*time.Minute {
		t.Fatal(err, d)
	}
	if b, _ := d.MarshalJSON(); string(b) != `"1h30m0s"` {
		t.Fatal(string(b))
	}
}

func TestErrorsSortedByPosition(t *testing.T) {
	_, err := Parse("p.yaml", []byte(header+"rules:\n- name: B\n  detector: {type: X}\n- name: C\n  detector: {type: Y}\n"), testCatalog{})
	es := Errors(err)
	if !sort.SliceIsSorted(es, func(i, j int) bool { return es[i].Line < es[j].Line }) || len(es) != 4 {
		t.Fatalf("errors not all reported in order: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(header + minimalRule))
	f.Add([]byte(header + "mode: enforce\nrules:\n- name: a\n  detector: {type: Thing, names: [a]}\n  action: {type: Raise, factor: 2}\n"))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte(header + "rules:\n- name: a\n  detector: {type: Thing\n  action: {type: X}\n"))
	f.Add([]byte(header + "rules:\n- name: a\n  detector:\n    type: Thing\n   x: 1\n"))
	f.Add([]byte("a: [\n\tb: 'c\n"))
	f.Add([]byte(header + "rules: [{name: a, detector: {type: Thing}}]\nkubeProxy: {metricsURL: 'http://[::1]:1/m'}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse("f.yaml", data, testCatalog{})
		if err != nil {
			if len(Errors(err)) == 0 {
				t.Fatalf("error without positions: %v", err)
			}
			return
		}
		if p == nil || len(p.Rules) == 0 || (p.Mode != Audit && p.Mode != Enforce) {
			t.Fatalf("accepted an invalid policy: %+v", p)
		}
		if _, err := Marshal(p); err != nil {
			t.Fatalf("marshal of accepted policy: %v", err)
		}
	})
}

// FuzzSyntaxPosition: whatever the bytes, a syntax error's position is
// never a crash, and an unclosed flow collection is said where that very
// '{' or '[' stands in the file.
func FuzzSyntaxPosition(f *testing.F) {
	const head = "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: audit\nrules:\n- name: a\n"
	f.Add([]byte(head + "  detector: {type: KubeProxyRuleBloat\n  action: {type: X}\n"))
	f.Add([]byte(head + "  detector: {type: [a, b}\n"))
	f.Add([]byte(head + "  detector: {a: b, c: {d: e}\n  x: y\n"))
	f.Add([]byte(head + "  detector: {type: '{[', x: \"}]\"\n  action: {type: X}\n"))
	f.Add([]byte("a: {b: 1\nc: 2\n"))
	f.Add([]byte("a: [[{\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > MaxSize {
			return
		}
		var n yaml.Node
		err := yaml.Unmarshal(data, &n)
		if err == nil {
			return
		}
		e := yamlSyntaxError("f.yaml", data, err)
		kind, open := flowCloserExpected(e.Msg[:max(0, strings.Index(e.Msg, " (the '"))])
		if !open || !strings.Contains(e.Msg, " (the '") {
			return
		}
		lines := strings.Split(string(data), "\n")
		if e.Line < 1 || e.Line > len(lines) {
			t.Fatalf("%q: line %d of %d", data, e.Line, len(lines))
		}
		// goccy/go-yaml's columns count characters (runes).
		l := []rune(lines[e.Line-1])
		if e.Column < 1 || e.Column > len(l) || byte(l[e.Column-1]) != kind {
			t.Fatalf("%q: %d:%d is not a '%c' (%v)", data, e.Line, e.Column, kind, e)
		}
	})
}

// TestHostilePolicyRejectedCheaply: 1 MiB of YAML aliases took 570 MB and
// 27 s to reject (issue 13); a billion-laughs nest of anchors would expand
// without bound. Both are refused before decoding, allocating under 50 MiB.
func TestHostilePolicyRejectedCheaply(t *testing.T) {
	items := header + "rules: [&r {name: r, detector: {type: Thing}}" + strings.Repeat(",*r", (MaxSize-200)/3) + "]\n"
	var laughs strings.Builder
	laughs.WriteString(header + "rules:\n- name: a\n  detector: {type: Thing, names: &a0 [x, x, x, x, x, x, x, x, x, x]}\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&laughs, "- name: l%d\n  detector: {type: Thing, names: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]}\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	for name, c := range map[string]struct {
		data string
		want string
	}{
		"1 MiB of aliases": {items, "more than 20000 lines and list/map items"},
		"billion laughs":   {laughs.String(), "more than 50000 values once aliases are expanded"},
		"over 1 MiB":       {header + minimalRule + "#" + strings.Repeat("x", MaxSize), "file larger than"},
	} {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		start := time.Now()
		_, err := Parse("p.yaml", []byte(c.data), testCatalog{})
		took := time.Since(start)
		runtime.ReadMemStats(&after)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %.300v, want %q", name, err, c.want)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 50<<20 {
			t.Errorf("%s: allocated %d MiB to reject (%s)", name, alloc>>20, took)
		}
	}
}

// Syntax errors are said at the parser's position, line and column: an
// unclosed '{' or '[' where it opens (yaml.v3's own context, which it
// said as "line 5" for line 6, column always 1; goccy/go-yaml alone said
// where the next key starts, 7:3), a bad indent where it is (yaml.v3 said
// 4:1 for 8:4).
func TestSyntaxErrorPosition(t *testing.T) {
	const head = "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: audit\nrules:\n- name: a\n"
	for _, c := range []struct{ name, body, want string }{
		// The two cases.
		{"unclosed brace", head + "  detector: {type: KubeProxyRuleBloat\n  action: {type: X}\n", "p.yaml:6:13: did not find expected ',' or '}' (the '{' here is not closed before 7:3)"},
		{"bad indent", head + "  detector:\n    type: KubeProxyRuleBloat\n   x: 1\n", "p.yaml:8:4: did not find expected key"},
		{"unclosed bracket", head + "  detector: [a, b\n  action: {type: X}\n", "p.yaml:6:13: did not find expected ',' or ']' (the '[' here is not closed before 7:3)"},
		{"unclosed outer brace, inner closed", head + "  detector: {a: b, c: {d: e}\n  x: y\n", "p.yaml:6:13: did not find expected ',' or '}' (the '{' here is not closed before 7:3)"},
		{"bracket closed by a brace", head + "  detector: {type: [a, b}\n", "p.yaml:6:20: did not find expected ',' or ']' (the '[' here is not closed before 6:25)"},
		{"unclosed brace on line 1", "a: {b: 1\nc: 2\n", "p.yaml:1:4: did not find expected ',' or '}' (the '{' here is not closed before 2:1)"},
		{"braces in quotes are not flow", head + "  detector: {type: '{[', x: \"}]\"\n  action: {type: X}\n", "p.yaml:6:13: did not find expected ',' or '}' (the '{' here is not closed before 7:3)"},
		{"unclosed list at end", "a: [", "p.yaml:1:4: did not find expected node content"},
		{"unclosed list after a comma", "a:\n  b: [1, 2,\n", "p.yaml:2:6: did not find expected node content"},
		{"tab indent", head + "  detector:\n\ttype: X\n", "p.yaml:7:1: found character that cannot start any token"},
		{"unclosed quote", head + "  detector: 'abc\n  action: x\n", "p.yaml:6:13: found unexpected end of stream"},
		{"extra closing brace", "a: {b: 1}}\n", "p.yaml:1:10: did not find expected key"},
		{"list item among keys", "a:\n  - b\n  c: d\n", "p.yaml:3:3: did not find expected '-' indicator"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.body), testCatalog{})
			if err == nil || err.Error() != c.want {
				t.Errorf("got  %v\nwant %s", err, c.want)
			}
		})
	}
}

// TestSyntaxErrorNearLine: where goccy/go-yaml accepts what yaml.v3
// refuses, the error says yaml.v3's line, "near line N", the 1-based line
// of the file: yaml.v3 names a parser error's line 0-based (it said "near
// line 2" for line 3, and nothing for line 1) and a scanner error's
// 1-based.
func TestSyntaxErrorNearLine(t *testing.T) {
	const head = "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\nmode: audit\nrules:\n- name: a\n"
	for _, c := range []struct{ name, body, want string }{
		// Parser errors.
		{"undefined tag handle", "a: 1\nb: !x!foo bar\n", "p.yaml: found undefined tag handle (near line 2)"},
		{"undefined tag handle on line 1", "a: !x!foo bar\n", "p.yaml: found undefined tag handle (near line 1)"},
		{"comma before a key", "apiVersion: remediate.dev/v1alpha1\nkind: RemediationPolicy\n,mode: audit\n", "p.yaml: did not find expected key (near line 3)"},
		{"question mark in a flow list", head + "  detector:\n    type: X\n    x: [1?, 2]\n", "p.yaml: did not find expected ',' or ']' (near line 8)"},
		{"closing brace as a value", head + "  detector:\n    type: }X\n", "p.yaml: did not find expected node content (near line 7)"},
		// Scanner errors: already 1-based.
		{"percent at a key", head + "  detector:\n    %type: X\n", "p.yaml: found character that cannot start any token (near line 7)"},
		{"unclosed verbatim tag", "a: 1\nb: !<x\n", "p.yaml: did not find the expected '>' (near line 2)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(c.body), testCatalog{})
			if err == nil || err.Error() != c.want {
				t.Errorf("got  %v\nwant %s", err, c.want)
			}
		})
	}
}

// TestYAMLParserProblemsComplete: yamlParserProblems lists every problem
// the pinned yaml.v3's parser reports (read from its parserc.go in the
// module cache), so that an upgrade adding one is caught here rather than
// said a line early.
func TestYAMLParserProblemsComplete(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "gopkg.in/yaml.v3").Output()
	if err != nil {
		t.Skipf("go list gopkg.in/yaml.v3: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "parserc.go"))
	if err != nil {
		t.Skipf("yaml.v3 source: %v", err)
	}
	// yaml_parser_set_parser_error(parser, "problem", mark) and
	// yaml_parser_set_parser_error_context(parser, "context", mark, "problem", mark).
	re := regexp.MustCompile(`yaml_parser_set_parser_error(_context)?\(parser,\s*("[^"]*"|\w+),\s*[\w.]+(,\s*"([^"]*)")?`)
	found := 0
	for _, m := range re.FindAllStringSubmatch(string(src), -1) {
		problem := strings.Trim(m[2], `"`)
		if m[1] != "" {
			problem = m[4]
		}
		found++
		if !yamlParserProblems[problem] {
			t.Errorf("yaml.v3 parser problem %q is not in yamlParserProblems", problem)
		}
	}
	if found < len(yamlParserProblems) {
		t.Errorf("found %d parser problems in yaml.v3's parserc.go, fewer than the %d listed: is the pattern broken?", found, len(yamlParserProblems))
	}
}
