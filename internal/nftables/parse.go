package nftables

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Ruleset is a parsed `nft -j list ruleset` (or `list table`): its tables in
// output order.
type Ruleset struct {
	// NFTVersion is the nft version from the listing's metainfo ("1.0.6").
	NFTVersion string   `json:"nftVersion,omitempty"`
	Tables     []*Table `json:"tables"`
	// Skipped counts objects of kinds this parser does not model
	// (flowtables, counters, quotas, ct helpers, ...).
	Skipped int `json:"skipped,omitempty"`
}

// Table is one nftables table.
type Table struct {
	Family  Family   `json:"family"`
	Name    string   `json:"name"`
	Handle  uint64   `json:"handle"`
	Comment string   `json:"comment,omitempty"`
	Flags   []string `json:"flags,omitempty"`
	// Chains and Sets (sets and maps) in output order.
	Chains []*Chain `json:"chains"`
	Sets   []*Set   `json:"sets"`

	chains map[string]*Chain
	sets   map[string]*Set
}

// Hook is what makes a chain a base chain: it is attached to a netfilter
// hook and runs for every packet passing it, in priority order (lower
// first) with the other base chains on that hook.
type Hook struct {
	// Type is the chain type: filter, nat or route.
	Type string `json:"type"`
	// Hook is the netfilter hook: prerouting, input, forward, output,
	// postrouting, ingress, egress.
	Hook string `json:"hook"`
	// Priority is the numeric priority (nft -j prints numbers; "dstnat"
	// is -100, "filter" 0, "srcnat" 100).
	Priority int `json:"priority"`
	// Policy is the verdict for packets no rule decided: accept or drop.
	Policy string `json:"policy"`
	// Device is the device of netdev ingress/egress chains.
	Device string `json:"device,omitempty"`
}

// Chain is a chain with its rules in order.
type Chain struct {
	Family  Family `json:"family"`
	Table   string `json:"table"`
	Name    string `json:"name"`
	Handle  uint64 `json:"handle"`
	Comment string `json:"comment,omitempty"`
	// Hook is nil for a regular chain (run only when jumped to).
	Hook  *Hook   `json:"hook,omitempty"`
	Rules []*Rule `json:"rules"`
}

// VerdictKind is an nftables verdict.
type VerdictKind string

// Verdicts.
const (
	Accept   VerdictKind = "accept"
	Drop     VerdictKind = "drop"
	Reject   VerdictKind = "reject"
	Jump     VerdictKind = "jump"
	Goto     VerdictKind = "goto"
	Return   VerdictKind = "return"
	Continue VerdictKind = "continue"
	Queue    VerdictKind = "queue"
)

// Verdict is a verdict statement or a verdict map's value.
type Verdict struct {
	Kind VerdictKind `json:"kind"`
	// Target is the chain of jump and goto.
	Target string `json:"target,omitempty"`
}

// String renders the verdict as nft prints it ("goto service-...").
func (v Verdict) String() string {
	if v.Target != "" {
		return string(v.Kind) + " " + v.Target
	}
	return string(v.Kind)
}

// Terminal reports whether the verdict ends evaluation of the packet in
// this base chain with a refusal (drop or reject).
func (v Verdict) Terminal() bool { return v.Kind == Drop || v.Kind == Reject }

// Match is one match expression ("ip daddr 10.96.0.1"), rendered.
type Match struct {
	// Op is the operator: ==, !=, <, >, <=, >=, in.
	Op    string `json:"op"`
	Left  string `json:"left"`
	Right string `json:"right"`
}

// VMap is a verdict-map statement: the packet's Key looked up in a named
// map (Map, e.g. "service-ips") or in the rule's anonymous map (Elements,
// e.g. kube-proxy's `numgen random mod 2 vmap { 0 : goto endpoint-..., 1 :
// goto endpoint-... }`).
type VMap struct {
	// Key is the looked-up expression, rendered ("ip daddr . meta l4proto
	// . th dport", "numgen random mod 2").
	Key string `json:"key"`
	// Map is the named map without its "@", or "" for an anonymous map.
	Map string `json:"map,omitempty"`
	// Elements are the anonymous map's entries (Key and Verdict set).
	Elements []Element `json:"elements,omitempty"`
}

// NAT is a NAT statement.
type NAT struct {
	// Kind is dnat, snat, masquerade or redirect.
	Kind string `json:"kind"`
	// Family is the statement's address family in inet tables ("ip",
	// "ip6"); empty in ip/ip6 tables.
	Family string `json:"family,omitempty"`
	// Addr is the address (or rendered expression); empty for
	// masquerade and redirect.
	Addr string `json:"addr,omitempty"`
	// Port is the port (or rendered expression), empty when not set.
	Port string `json:"port,omitempty"`
}

// Rule is one rule: its statements summarised into what the checks need,
// and its full text.
type Rule struct {
	Handle  uint64 `json:"handle"`
	Comment string `json:"comment,omitempty"`
	// Text is the rule rendered close to nft's own syntax.
	Text string `json:"text"`
	// Statements are the kinds of the rule's statements in order
	// ("match", "counter", "jump", ...).
	Statements []string `json:"statements"`
	// Matches are the match expressions, in order.
	Matches []Match `json:"matches,omitempty"`
	// Verdict is the rule's verdict statement (the last one, if several),
	// nil when it has none (a rule that only counts, marks or NATs).
	Verdict *Verdict `json:"verdict,omitempty"`
	// VMap is the rule's verdict-map statement, if any.
	VMap *VMap `json:"vmap,omitempty"`
	// NAT is the rule's NAT statement, if any.
	NAT *NAT `json:"nat,omitempty"`
	// Conditional is true when any statement can make the rule not apply
	// to a packet (a match, a lookup, a limit, a quota, a statement this
	// parser does not know). A rule with Conditional false and a drop or
	// reject Verdict drops every packet reaching it.
	Conditional bool `json:"conditional"`
}

// UnconditionalRefusal reports whether the rule applies to every packet reaching
// it and ends in a drop or reject.
func (r *Rule) UnconditionalRefusal() bool {
	return !r.Conditional && r.Verdict != nil && r.Verdict.Terminal()
}

// Targets returns the chains the rule can jump or go to: its verdict's and
// those in its anonymous verdict map.
func (r *Rule) Targets() []string {
	var out []string
	if r.Verdict != nil && r.Verdict.Target != "" {
		out = append(out, r.Verdict.Target)
	}
	if r.VMap != nil {
		for _, e := range r.VMap.Elements {
			if e.Verdict != nil && e.Verdict.Target != "" {
				out = append(out, e.Verdict.Target)
			}
		}
	}
	return out
}

// Set is a set or a map.
type Set struct {
	Family Family `json:"family"`
	Table  string `json:"table"`
	Name   string `json:"name"`
	Handle uint64 `json:"handle"`
	// IsMap is true for a map (elements have values).
	IsMap bool `json:"isMap"`
	// KeyType is the element type, one entry per concatenated component
	// (["ipv4_addr", "inet_proto", "inet_service"]).
	KeyType []string `json:"keyType"`
	// ValueType is a map's value type ("verdict", "ipv4_addr", ...).
	ValueType string    `json:"valueType,omitempty"`
	Flags     []string  `json:"flags,omitempty"`
	Comment   string    `json:"comment,omitempty"`
	Elements  []Element `json:"elements"`

	// meta is what the netlink reader needs while it reads the elements;
	// nil once they are read.
	meta *setMeta
}

// Element is one set or map element.
type Element struct {
	// Key has one rendered value per concatenated component
	// (["10.96.0.1", "tcp", "443"]); prefixes render "10.0.0.0/8", ranges
	// "1-5".
	Key []string `json:"key"`
	// Verdict is a verdict map element's value.
	Verdict *Verdict `json:"verdict,omitempty"`
	// Value is any other map element's value, rendered.
	Value string `json:"value,omitempty"`
	// Comment is the element's comment (kube-proxy puts the service port
	// name on its no-endpoint and firewall elements).
	Comment string `json:"comment,omitempty"`
}

// Table returns the table of that family and name, or nil.
func (r *Ruleset) Table(f Family, name string) *Table {
	if r == nil {
		return nil
	}
	for _, t := range r.Tables {
		if t.Family == f && t.Name == name {
			return t
		}
	}
	return nil
}

// BaseChains returns every base chain of every table.
func (r *Ruleset) BaseChains() []*Chain {
	if r == nil {
		return nil
	}
	var out []*Chain
	for _, t := range r.Tables {
		for _, c := range t.Chains {
			if c.Hook != nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// Chain returns the chain with that name, or nil.
func (t *Table) Chain(name string) *Chain {
	if t == nil {
		return nil
	}
	return t.chains[name]
}

// Set returns the set or map with that name, or nil.
func (t *Table) Set(name string) *Set {
	if t == nil {
		return nil
	}
	return t.sets[name]
}

// JumpsTo reports whether a rule of the chain jumps or goes to target
// (directly, in its verdict or its anonymous verdict map).
func (c *Chain) JumpsTo(target string) bool {
	if c == nil {
		return false
	}
	for _, r := range c.Rules {
		for _, t := range r.Targets() {
			if t == target {
				return true
			}
		}
	}
	return false
}

// ID names the chain for messages and targets: "ip kube-proxy nat-prerouting".
func (c *Chain) ID() string { return string(c.Family) + " " + c.Table + " " + c.Name }

// maxDepth bounds the nesting the renderer follows; deeper input renders
// as "…".
const maxDepth = 32

// Parse parses nft's JSON output (`{"nftables": [...]}`), one object at a
// time so memory follows the parsed result rather than the whole text. It
// does not bound its input: callers limit the reader (the real adapter
// does). Malformed input is an error, never a panic.
func Parse(r io.Reader) (*Ruleset, error) {
	dec := json.NewDecoder(r)
	dec.UseNumber()
	if err := expectDelim(dec, '{'); err != nil {
		return nil, err
	}
	rs := &Ruleset{}
	seen := false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("nft json: %w", err)
		}
		key, _ := tok.(string)
		if key != "nftables" {
			var skip json.RawMessage
			if err := dec.Decode(&skip); err != nil {
				return nil, fmt.Errorf("nft json: %w", err)
			}
			continue
		}
		seen = true
		if err := expectDelim(dec, '['); err != nil {
			return nil, err
		}
		for i := 0; dec.More(); i++ {
			var obj jsonObject
			if err := dec.Decode(&obj); err != nil {
				return nil, fmt.Errorf("nft json: object %d: %w", i, err)
			}
			if err := rs.add(&obj); err != nil {
				return nil, fmt.Errorf("nft json: object %d: %w", i, err)
			}
		}
		if err := expectDelim(dec, ']'); err != nil {
			return nil, err
		}
	}
	if err := expectDelim(dec, '}'); err != nil {
		return nil, err
	}
	if !seen {
		return nil, errors.New(`nft json: no "nftables" array`)
	}
	// Anything after the document is an error (a second document, junk).
	if _, err := dec.Token(); err != io.EOF {
		if err == nil {
			return nil, errors.New("nft json: data after the document")
		}
		return nil, fmt.Errorf("nft json: %w", err)
	}
	return rs, nil
}

// ParseString parses a listing held in a string.
func ParseString(s string) (*Ruleset, error) { return Parse(strings.NewReader(s)) }

// ParseBytes parses a listing held in a byte slice.
func ParseBytes(b []byte) (*Ruleset, error) { return Parse(bytes.NewReader(b)) }

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return err
		}
		return fmt.Errorf("nft json: want %q: %w", want, err)
	}
	if d, ok := tok.(json.Delim); !ok || d != want {
		return fmt.Errorf("nft json: want %q, got %v", want, tok)
	}
	return nil
}

type jsonTable struct {
	Family  Family `json:"family"`
	Name    string `json:"name"`
	Handle  uint64 `json:"handle"`
	Comment string `json:"comment"`
	Flags   any    `json:"flags"`
}

type jsonChain struct {
	Family  Family `json:"family"`
	Table   string `json:"table"`
	Name    string `json:"name"`
	Handle  uint64 `json:"handle"`
	Comment string `json:"comment"`
	Type    string `json:"type"`
	Hook    string `json:"hook"`
	Prio    *int   `json:"prio"`
	Policy  string `json:"policy"`
	Dev     any    `json:"dev"`
}

type jsonSet struct {
	Family  Family `json:"family"`
	Table   string `json:"table"`
	Name    string `json:"name"`
	Handle  uint64 `json:"handle"`
	Type    any    `json:"type"`
	Map     any    `json:"map"`
	Flags   any    `json:"flags"`
	Comment string `json:"comment"`
	Elem    []any  `json:"elem"`
}

type jsonRule struct {
	Family  Family `json:"family"`
	Table   string `json:"table"`
	Chain   string `json:"chain"`
	Handle  uint64 `json:"handle"`
	Comment string `json:"comment"`
	Expr    []any  `json:"expr"`
}

// jsonObject is one element of the "nftables" array: exactly one of the
// fields is set for the kinds modelled here; none for other kinds
// (flowtable, counter, quota, ...). Decoding straight into it (rather than
// into raw messages decoded again) halves the parse's allocations.
type jsonObject struct {
	Metainfo *struct {
		Version string `json:"version"`
	} `json:"metainfo"`
	Table *jsonTable `json:"table"`
	Chain *jsonChain `json:"chain"`
	Set   *jsonSet   `json:"set"`
	Map   *jsonSet   `json:"map"`
	Rule  *jsonRule  `json:"rule"`
}

func (rs *Ruleset) add(obj *jsonObject) error {
	n := 0
	for _, set := range []bool{obj.Metainfo != nil, obj.Table != nil, obj.Chain != nil, obj.Set != nil, obj.Map != nil, obj.Rule != nil} {
		if set {
			n++
		}
	}
	switch {
	case n == 0:
		rs.Skipped++
		return nil
	case n > 1:
		return fmt.Errorf("want one kind per object, got %d", n)
	}
	switch {
	case obj.Metainfo != nil:
		rs.NFTVersion = obj.Metainfo.Version
	case obj.Table != nil:
		j := obj.Table
		if j.Family == "" || j.Name == "" {
			return errors.New("table without family or name")
		}
		if rs.Table(j.Family, j.Name) != nil {
			return fmt.Errorf("table %s %s listed twice", j.Family, j.Name)
		}
		rs.Tables = append(rs.Tables, &Table{Family: j.Family, Name: j.Name, Handle: j.Handle, Comment: j.Comment,
			Flags: strList(j.Flags), chains: map[string]*Chain{}, sets: map[string]*Set{}})
	case obj.Chain != nil:
		j := obj.Chain
		t, err := rs.tableOf(j.Family, j.Table)
		if err != nil {
			return fmt.Errorf("chain %q: %w", j.Name, err)
		}
		if j.Name == "" {
			return fmt.Errorf("chain without name in table %s %s", j.Family, j.Table)
		}
		if t.chains[j.Name] != nil {
			return fmt.Errorf("chain %q listed twice in table %s %s", j.Name, j.Family, j.Table)
		}
		c := &Chain{Family: j.Family, Table: j.Table, Name: j.Name, Handle: j.Handle, Comment: j.Comment}
		if j.Hook != "" {
			h := &Hook{Type: j.Type, Hook: j.Hook, Policy: j.Policy, Device: strings.Join(strList(j.Dev), ",")}
			if j.Prio != nil {
				h.Priority = *j.Prio
			}
			if h.Policy == "" {
				h.Policy = "accept"
			}
			c.Hook = h
		}
		t.chains[c.Name] = c
		t.Chains = append(t.Chains, c)
	case obj.Set != nil || obj.Map != nil:
		j, kind := obj.Set, "set"
		if j == nil {
			j, kind = obj.Map, "map"
		}
		t, err := rs.tableOf(j.Family, j.Table)
		if err != nil {
			return fmt.Errorf("%s %q: %w", kind, j.Name, err)
		}
		if j.Name == "" {
			return fmt.Errorf("%s without name in table %s %s", kind, j.Family, j.Table)
		}
		if t.sets[j.Name] != nil {
			return fmt.Errorf("set or map %q listed twice in table %s %s", j.Name, j.Family, j.Table)
		}
		s := &Set{Family: j.Family, Table: j.Table, Name: j.Name, Handle: j.Handle, IsMap: kind == "map",
			KeyType: strList(j.Type), Flags: strList(j.Flags), Comment: j.Comment}
		if s.IsMap {
			s.ValueType = strings.Join(strList(j.Map), " . ")
		}
		s.Elements = make([]Element, 0, len(j.Elem))
		for _, e := range j.Elem {
			s.Elements = append(s.Elements, element(e, s.IsMap))
		}
		t.sets[s.Name] = s
		t.Sets = append(t.Sets, s)
	case obj.Rule != nil:
		j := obj.Rule
		t, err := rs.tableOf(j.Family, j.Table)
		if err != nil {
			return fmt.Errorf("rule %d: %w", j.Handle, err)
		}
		c := t.chains[j.Chain]
		if c == nil {
			return fmt.Errorf("rule %d: no chain %q in table %s %s", j.Handle, j.Chain, j.Family, j.Table)
		}
		c.Rules = append(c.Rules, rule(*j))
	}
	return nil
}

func (rs *Ruleset) tableOf(f Family, name string) (*Table, error) {
	t := rs.Table(f, name)
	if t == nil {
		return nil, fmt.Errorf("table %s %s not listed before its contents", f, name)
	}
	return t, nil
}

// strList reads a JSON string or list of strings ("type": "ipv4_addr" or
// ["ipv4_addr", "inet_proto"]); other values render.
func strList(v any) []string {
	switch x := v.(type) {
	case nil:
		return nil
	case string:
		return []string{x}
	case []any:
		out := make([]string, 0, len(x))
		for _, e := range x {
			out = append(out, render(e, 0))
		}
		return out
	}
	return []string{render(v, 0)}
}

// element reads a set element (a value, or {"elem": {"val": ..., "comment":
// ...}}) or a map element ([key, value]).
func element(v any, isMap bool) Element {
	var e Element
	key := v
	if isMap {
		if pair, ok := v.([]any); ok && len(pair) == 2 {
			key = pair[0]
			if vd, ok := verdictOf(pair[1]); ok {
				e.Verdict = &vd
			} else {
				e.Value = render(pair[1], 0)
			}
		}
	}
	key, e.Comment = unwrapElem(key)
	if m, ok := key.(map[string]any); ok {
		if parts, ok := m["concat"].([]any); ok {
			for _, p := range parts {
				e.Key = append(e.Key, render(p, 0))
			}
			return e
		}
	}
	e.Key = []string{render(key, 0)}
	return e
}

// unwrapElem removes the {"elem": {"val": X, "comment": C, "timeout": ...}}
// wrapper nft uses for elements with options.
func unwrapElem(v any) (any, string) {
	m, ok := v.(map[string]any)
	if !ok {
		return v, ""
	}
	inner, ok := m["elem"].(map[string]any)
	if !ok || len(m) != 1 {
		return v, ""
	}
	c, _ := inner["comment"].(string)
	return inner["val"], c
}

// verdictOf reads a verdict object ({"accept": null}, {"goto": {"target":
// "x"}}, {"reject": {...}}).
func verdictOf(v any) (Verdict, bool) {
	m, ok := v.(map[string]any)
	if !ok || len(m) != 1 {
		return Verdict{}, false
	}
	for k, arg := range m {
		switch VerdictKind(k) {
		case Accept, Drop, Reject, Return, Continue, Queue:
			return Verdict{Kind: VerdictKind(k)}, true
		case Jump, Goto:
			a, _ := arg.(map[string]any)
			t, _ := a["target"].(string)
			return Verdict{Kind: VerdictKind(k), Target: t}, true
		}
	}
	return Verdict{}, false
}

// unconditionalStatements can not make a rule skip a packet.
var unconditionalStatements = map[string]bool{
	"counter": true, "log": true, "notrack": true, "mangle": true,
}

func rule(j jsonRule) *Rule {
	r := &Rule{Handle: j.Handle, Comment: j.Comment}
	var text []string
	for _, st := range j.Expr {
		m, ok := st.(map[string]any)
		if !ok || len(m) != 1 {
			r.Statements = append(r.Statements, "?")
			r.Conditional = true
			text = append(text, render(st, 0))
			continue
		}
		for kind, arg := range m {
			r.Statements = append(r.Statements, kind)
			if v, ok := verdictOf(st); ok {
				r.Verdict = &v
				text = append(text, v.String())
				continue
			}
			a, _ := arg.(map[string]any)
			switch kind {
			case "match":
				mt := Match{Op: str(a["op"]), Left: render(a["left"], 0), Right: render(a["right"], 0)}
				r.Matches = append(r.Matches, mt)
				r.Conditional = true
				if mt.Op == "==" || mt.Op == "in" {
					text = append(text, mt.Left+" "+mt.Right)
				} else {
					text = append(text, mt.Left+" "+mt.Op+" "+mt.Right)
				}
			case "vmap":
				vm := &VMap{Key: render(a["key"], 0)}
				switch d := a["data"].(type) {
				case string:
					vm.Map = strings.TrimPrefix(d, "@")
				case map[string]any:
					if elems, ok := d["set"].([]any); ok {
						for _, e := range elems {
							vm.Elements = append(vm.Elements, element(e, true))
						}
					}
				}
				r.VMap = vm
				r.Conditional = true
				text = append(text, vm.Key+" vmap "+render(a["data"], 0))
			case "dnat", "snat", "masquerade", "redirect":
				n := &NAT{Kind: kind}
				if a != nil {
					n.Family = str(a["family"])
					if x, ok := a["addr"]; ok {
						n.Addr = render(x, 0)
					}
					if x, ok := a["port"]; ok {
						n.Port = render(x, 0)
					}
				}
				r.NAT = n
				text = append(text, natText(n))
			default:
				if !unconditionalStatements[kind] {
					r.Conditional = true
				}
				text = append(text, render(st, 0))
			}
		}
	}
	r.Text = strings.Join(text, " ")
	return r
}

func natText(n *NAT) string {
	s := n.Kind
	if n.Family != "" {
		s += " " + n.Family
	}
	switch {
	case n.Addr != "" && n.Port != "":
		if strings.Contains(n.Addr, ":") {
			return s + " to [" + n.Addr + "]:" + n.Port
		}
		return s + " to " + n.Addr + ":" + n.Port
	case n.Addr != "":
		return s + " to " + n.Addr
	case n.Port != "":
		return s + " to :" + n.Port
	}
	return s
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// binaryOps are nft's binary expressions in JSON.
var binaryOps = map[string]bool{"&": true, "|": true, "^": true, "<<": true, ">>": true}

// render turns an expression into text close to nft's syntax. Unknown
// expressions render as their JSON key with their arguments; nesting
// beyond maxDepth renders as "…".
func render(v any, depth int) string {
	if depth > maxDepth {
		return "…"
	}
	d := depth + 1
	switch x := v.(type) {
	case nil:
		return ""
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		if x {
			return "true"
		}
		return "false"
	case float64:
		return fmt.Sprint(x)
	case []any:
		parts := make([]string, 0, len(x))
		for _, e := range x {
			parts = append(parts, render(e, d))
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	case map[string]any:
		if vd, ok := verdictOf(x); ok {
			return vd.String()
		}
		if len(x) != 1 {
			return renderObject(x, d)
		}
		for k, arg := range x {
			a, _ := arg.(map[string]any)
			switch k {
			case "payload":
				if p := str(a["protocol"]); p != "" {
					return p + " " + str(a["field"])
				}
				return "@" + render(a["base"], d) + "," + render(a["offset"], d) + "," + render(a["len"], d)
			case "meta":
				return "meta " + str(a["key"])
			case "ct":
				s := "ct"
				if dir := str(a["dir"]); dir != "" {
					s += " " + dir
				}
				return s + " " + str(a["key"])
			case "fib":
				return "fib " + strings.Join(strList(a["flags"]), " . ") + " " + str(a["result"])
			case "numgen":
				s := "numgen " + str(a["mode"]) + " mod " + render(a["mod"], d)
				if off := render(a["offset"], d); off != "" && off != "0" {
					s += " offset " + off
				}
				return s
			case "concat":
				parts := make([]string, 0)
				if l, ok := arg.([]any); ok {
					for _, e := range l {
						parts = append(parts, render(e, d))
					}
				}
				return strings.Join(parts, " . ")
			case "prefix":
				return render(a["addr"], d) + "/" + render(a["len"], d)
			case "range":
				if l, ok := arg.([]any); ok && len(l) == 2 {
					return render(l[0], d) + "-" + render(l[1], d)
				}
			case "set":
				if l, ok := arg.([]any); ok {
					parts := make([]string, 0, len(l))
					for _, e := range l {
						if pair, ok := e.([]any); ok && len(pair) == 2 {
							parts = append(parts, render(pair[0], d)+" : "+render(pair[1], d))
						} else {
							parts = append(parts, render(e, d))
						}
					}
					return "{ " + strings.Join(parts, ", ") + " }"
				}
				return render(arg, d)
			case "map":
				return render(a["key"], d) + " map " + render(a["data"], d)
			case "elem":
				return render(a["val"], d)
			case "counter":
				return "counter"
			case "mangle":
				return render(a["key"], d) + " set " + render(a["value"], d)
			}
			if binaryOps[k] {
				if l, ok := arg.([]any); ok && len(l) == 2 {
					return render(l[0], d) + " " + k + " " + render(l[1], d)
				}
			}
			if arg == nil {
				return k
			}
			if a != nil {
				return k + " " + renderObject(a, d)
			}
			return k + " " + render(arg, d)
		}
	}
	return fmt.Sprintf("%v", v)
}

// renderObject renders a JSON object's fields sorted by key: "k1 v1 k2 v2".
func renderObject(m map[string]any, depth int) string {
	if depth > maxDepth {
		return "…"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+" "+render(m[k], depth+1))
	}
	return strings.Join(parts, " ")
}
