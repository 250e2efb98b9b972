package iptables

import (
	"fmt"
	"strconv"
	"strings"
)

// This file holds kube-proxy's canonical rules in iptables mode, as
// kube-proxy v1.34 writes them (pkg/proxy/iptables/proxier.go: the
// iptablesJumpChains table, the KUBE-POSTROUTING and KUBE-MARK-MASQ rules
// written on every sync, and the per-Service rules of syncProxyRules), and
// KubeProxyDefects, which reports where a saved rule set departs from them:
// a jump, the masquerade mark rule or the MASQUERADE rule missing, or a
// rule that lost the match conditions kube-proxy gives it. The last is
// what the field guides call version-skew corruption: an iptables binary
// of another version or backend saves and restores rules it cannot fully
// decode and writes them back without their matches, so a targeted rule
// becomes a broad one (a DROP for everything, a RETURN before MASQUERADE
// for everything, a DNAT for every destination).

// DefaultMasqueradeMark is kube-proxy's masquerade mark with the default
// masqueradeBit 14.
const DefaultMasqueradeMark = "0x4000"

// Defect checks: the stable names a Defect's Check carries.
const (
	// CheckJump: a built-in chain's jump to a kube-proxy chain is missing
	// (Chain is the built-in chain, Want names the jump).
	CheckJump = "jump"
	// CheckMarkMasq: KUBE-MARK-MASQ's mark rule is missing or changed.
	CheckMarkMasq = "mark"
	// CheckReturn: KUBE-POSTROUTING's RETURN for unmarked packets is
	// missing, lost its mark match or changed.
	CheckReturn = "return"
	// CheckClearMark: KUBE-POSTROUTING's rule clearing the mark is
	// missing or changed.
	CheckClearMark = "clear-mark"
	// CheckMasquerade: KUBE-POSTROUTING's MASQUERADE rule is missing,
	// changed or unreachable.
	CheckMasquerade = "masquerade"
	// CheckLostMatch: a kube-proxy rule lacks match conditions kube-proxy
	// always writes for its chain and target.
	CheckLostMatch = "lost-match"
	// CheckShadowed: an unconditional jump in a Service chain is followed
	// by rules it makes unreachable (a load-balancing or policy rule lost
	// its statistic, recent, source or address-type match).
	CheckShadowed = "shadowed"
)

// Defect is one departure of a saved rule set from kube-proxy's canonical
// rules.
type Defect struct {
	// Table and Chain where the rule is (or should be).
	Table, Chain string
	// Check is one of the Check* names.
	Check string
	// Rule is the offending rule as an iptables-save line; "" when the
	// rule is missing.
	Rule string
	// Line is Rule's line in the save output (0 when missing).
	Line int
	// Missing lists the match conditions the rule lacks ("-d", "! --mark
	// 0x4000/0x4000"); empty for missing or changed rules.
	Missing []string
	// Want is the canonical rule, or what it must contain.
	Want string
	// Problem says what is wrong, in words ("missing", "lost its match
	// conditions", "changed: ...").
	Problem string
	// Impact says what the defect does to traffic.
	Impact string
	// To is the jump's destination for CheckJump defects.
	To string
	// Breaks is true when the defect loses traffic (not only changes
	// addresses or counters).
	Breaks bool
}

// ChainGroup returns the name a chain is reported under: per-Service
// chains (KUBE-SVC-*, KUBE-SVL-*, KUBE-EXT-*, KUBE-FW-*, KUBE-SEP-*)
// collapse to their prefix with "*", so that one corruption of thousands of
// endpoint chains is one finding.
func ChainGroup(chain string) string {
	for i, p := range servicePrefixes {
		if strings.HasPrefix(chain, p) {
			return serviceGroups[i]
		}
	}
	return chain
}

var (
	servicePrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-", "KUBE-SEP-"}
	serviceGroups   = []string{"KUBE-SVC-*", "KUBE-SVL-*", "KUBE-EXT-*", "KUBE-FW-*", "KUBE-SEP-*"}
)

func isServiceChain(chain string) bool {
	for _, p := range servicePrefixes {
		if strings.HasPrefix(chain, p) {
			return true
		}
	}
	return false
}

// kubeJump is one of kube-proxy's jumps from a built-in chain
// (iptablesJumpChains and iptablesKubeletJumpChains in proxier.go).
type kubeJump struct {
	table, from, to string
	// cond are the conditions kube-proxy adds besides the comment.
	cond []string
}

// kubeProxyJumps are kube-proxy's jumps from built-in chains in iptables
// mode.
var kubeProxyJumps = []kubeJump{
	{"nat", "PREROUTING", "KUBE-SERVICES", nil},
	{"nat", "OUTPUT", "KUBE-SERVICES", nil},
	{"nat", "POSTROUTING", "KUBE-POSTROUTING", nil},
	{"filter", "INPUT", "KUBE-EXTERNAL-SERVICES", []string{"--ctstate NEW"}},
	{"filter", "FORWARD", "KUBE-EXTERNAL-SERVICES", []string{"--ctstate NEW"}},
	{"filter", "INPUT", "KUBE-NODEPORTS", nil},
	{"filter", "FORWARD", "KUBE-SERVICES", []string{"--ctstate NEW"}},
	{"filter", "OUTPUT", "KUBE-SERVICES", []string{"--ctstate NEW"}},
	{"filter", "FORWARD", "KUBE-FORWARD", nil},
	{"filter", "INPUT", "KUBE-PROXY-FIREWALL", []string{"--ctstate NEW"}},
	{"filter", "OUTPUT", "KUBE-PROXY-FIREWALL", []string{"--ctstate NEW"}},
	{"filter", "FORWARD", "KUBE-PROXY-FIREWALL", []string{"--ctstate NEW"}},
	{"filter", "INPUT", "KUBE-FIREWALL", nil},
	{"filter", "OUTPUT", "KUBE-FIREWALL", nil},
}

// DefectOptions tune KubeProxyDefects.
type DefectOptions struct {
	// SkipServicesJumps leaves out the nat PREROUTING/OUTPUT → KUBE-SERVICES jumps
	// (checked on their own by the caller).
	SkipServicesJumps bool
	// SkipBareFirewallDrop leaves out a KUBE-FIREWALL DROP without any
	// condition (reported on its own by the caller).
	SkipBareFirewallDrop bool
}

// KubeProxyDefects compares a rule set of one family and backend with
// kube-proxy's canonical iptables-mode rules. A rule set in which kube-proxy
// has not programmed anything (no nat KUBE-SERVICES and no nat
// KUBE-POSTROUTING chain) has no defects. The result is in a stable order:
// jumps, the masquerade rules, then rules in save order.
func KubeProxyDefects(rs *Ruleset, o DefectOptions) []Defect {
	nat, filter := rs.Table("nat"), rs.Table("filter")
	if nat.Chain("KUBE-SERVICES") == nil && nat.Chain("KUBE-POSTROUTING") == nil {
		return nil
	}
	if nat.Chain("KUBE-NODE-PORT") != nil || nat.Chain("KUBE-LOAD-BALANCER") != nil {
		// IPVS mode's chains: its KUBE-POSTROUTING and Service rules
		// differ (ipset matches); not checked here.
		return nil
	}
	var out []Defect
	out = append(out, jumpDefects(rs, o)...)
	mark, markDefects := markMasqDefects(nat)
	out = append(out, markDefects...)
	out = append(out, postroutingDefects(nat, mark)...)
	buf := make(ruleOpts, 0, 16)
	for _, t := range []*Table{filter, nat} {
		if t == nil {
			continue
		}
		for _, c := range t.Chains {
			if !kubeProxyChain(c.Name) {
				continue
			}
			out = append(out, ruleDefects(t.Name, c, mark, o, &buf)...)
		}
	}
	return out
}

// kubeProxyChain reports whether kube-proxy's iptables mode writes the
// chain's rules (other KUBE-* chains belong to kubelet, kube-router, ...).
func kubeProxyChain(name string) bool {
	switch name {
	case "KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL", "KUBE-FIREWALL":
		return true
	}
	return isServiceChain(name)
}

func jumpDefects(rs *Ruleset, o DefectOptions) []Defect {
	var out []Defect
	for _, j := range kubeProxyJumps {
		if o.SkipServicesJumps && j.table == "nat" && j.to == "KUBE-SERVICES" {
			continue
		}
		t := rs.Table(j.table)
		if t.Chain(j.to) == nil {
			// kube-proxy creates every chain it jumps to; one that is
			// absent is another program's leftover or a mode without
			// it (KUBE-FIREWALL on IPv6 with kubelet's rule off).
			continue
		}
		want := "-A " + j.from + " " + strings.Join(append(condArgs(j.cond), "-j", j.to), " ")
		var found *Rule
		if c := t.Chain(j.from); c != nil {
			for i := range c.Rules {
				if c.Rules[i].Target == j.to {
					found = &c.Rules[i]
					break
				}
			}
		}
		if found == nil {
			out = append(out, Defect{Table: j.table, Chain: j.from, Check: CheckJump, Want: want, To: j.to,
				Problem: "missing jump to " + j.to, Impact: jumpImpact(j), Breaks: j.table == "nat" || j.to == "KUBE-FORWARD"})
			continue
		}
		if miss := missingConds(*found, j.cond); len(miss) > 0 {
			out = append(out, Defect{Table: j.table, Chain: j.from, Check: CheckJump, To: j.to, Rule: found.Text(j.from), Line: found.Line,
				Missing: miss, Want: want, Problem: "jump to " + j.to + " lost its match conditions",
				Impact: "the chain sees packets of established connections too"})
		}
	}
	return out
}

func jumpImpact(j kubeJump) string {
	switch j.to {
	case "KUBE-SERVICES":
		return "Service traffic through " + j.from + " is not load-balanced"
	case "KUBE-POSTROUTING":
		return "Service traffic marked for SNAT is never masqueraded: replies from backends on other nodes do not come back"
	case "KUBE-FORWARD":
		return "forwarded Service traffic is not accepted when the FORWARD policy drops"
	case "KUBE-FIREWALL":
		return "the localnet protection (route_localnet) is off"
	}
	return j.to + " is not consulted from " + j.from
}

func condArgs(conds []string) []string {
	var out []string
	for _, c := range conds {
		out = append(out, strings.Fields(c)...)
	}
	return out
}

// ruleOpts is a rule's options before its target, in order (a rule has
// a handful: a slice searched linearly is cheaper than a map).
type ruleOpts []optVal

type optVal struct {
	name, val string
	neg       bool
}

func (o ruleOpts) get(name string) (optVal, bool) {
	for _, v := range o {
		if v.name == name {
			return v, true
		}
	}
	return optVal{}, false
}

// opts returns the rule's match options (everything before -j/-g except
// comments), keyed by option name ("-d", "--dport", "--mark"); "-m"
// modules are entries named "-m" with the module as value.
func (r Rule) opts() ruleOpts { return r.appendOpts(make(ruleOpts, 0, 8)) }

// appendOpts is opts appending to o (callers reuse one buffer).
func (r Rule) appendOpts(o ruleOpts) ruleOpts {
	neg := false
	for i := 0; i < len(r.Args); i++ {
		a := r.Args[i]
		if a == "-j" || a == "-g" || a == "--jump" || a == "--goto" {
			break
		}
		if a == "!" {
			neg = true
			continue
		}
		if a == "-m" || a == "--match" {
			if i+1 < len(r.Args) {
				o = append(o, optVal{name: "-m", val: r.Args[i+1]})
				i++
			}
			neg = false
			continue
		}
		if !strings.HasPrefix(a, "-") {
			neg = false
			continue
		}
		v := ""
		if i+1 < len(r.Args) && r.Args[i+1] != "!" && !strings.HasPrefix(r.Args[i+1], "-") {
			v = r.Args[i+1]
			i++
		}
		o = append(o, optVal{name: canonicalOpt(a), val: v, neg: neg})
		neg = false
	}
	return o
}

// hasConditions reports whether the rule has any condition besides
// comments (Conditions without allocating).
func (r Rule) hasConditions() bool {
	for i := 0; i < len(r.Args); i++ {
		a := r.Args[i]
		if a == "-j" || a == "-g" || a == "--jump" || a == "--goto" {
			return false
		}
		if (a == "-m" || a == "--match") && i+1 < len(r.Args) && r.Args[i+1] == "comment" {
			i++
			for i+1 < len(r.Args) && r.Args[i+1] == "--comment" {
				i += 2
			}
			continue
		}
		return true
	}
	return false
}

// canonicalOpt maps long option spellings to the short ones iptables-save
// prints.
func canonicalOpt(a string) string {
	switch a {
	case "--destination", "--dst":
		return "-d"
	case "--source", "--src":
		return "-s"
	case "--protocol":
		return "-p"
	case "--destination-port":
		return "--dport"
	case "--state":
		return "--ctstate"
	}
	return a
}

// has reports whether condition c holds in o. c is an option name ("-d"),
// an option with a value ("--ctstate NEW", "--dst-type LOCAL"), or either
// negated with a leading "! ".
func (o ruleOpts) has(c string) bool {
	neg := strings.HasPrefix(c, "! ")
	c = strings.TrimPrefix(c, "! ")
	name, val, _ := strings.Cut(c, " ")
	v, ok := o.get(name)
	if !ok || v.neg != neg {
		return false
	}
	return val == "" || v.val == val
}

func missingConds(r Rule, conds []string) []string {
	return r.opts().missing(conds)
}

func (o ruleOpts) missing(conds []string) []string {
	var miss []string
	for _, c := range conds {
		if !o.has(c) {
			miss = append(miss, c)
		}
	}
	return miss
}

// targetOpt returns the value of a target option (after -j).
func (r Rule) targetOpt(opt string) (string, bool) {
	in := false
	for i, a := range r.Args {
		if a == "-j" || a == "--jump" {
			in = true
			continue
		}
		if in && a == opt {
			if i+1 < len(r.Args) {
				return r.Args[i+1], true
			}
			return "", true
		}
	}
	return "", false
}

// markValue parses "0x4000" or "0x4000/0x4000" into value and mask (mask
// 0xffffffff when absent).
func markValue(s string) (val, mask uint64, ok bool) {
	v, m, hasMask := strings.Cut(s, "/")
	val, err := strconv.ParseUint(v, 0, 32)
	if err != nil {
		return 0, 0, false
	}
	mask = 0xffffffff
	if hasMask {
		if mask, err = strconv.ParseUint(m, 0, 32); err != nil {
			return 0, 0, false
		}
	}
	return val, mask, true
}

// setMark returns the MARK target's effect as --set-xmark value/mask
// (iptables-save prints --or-mark M as M/M, --xor-mark M as M/0x0, and
// --set-mark M as M/0xffffffff).
func (r Rule) setMark() (val, mask uint64, ok bool) {
	if r.Target != "MARK" {
		return 0, 0, false
	}
	if s, ok := r.targetOpt("--set-xmark"); ok {
		return markValue(s)
	}
	if s, ok := r.targetOpt("--or-mark"); ok {
		v, _, ok := markValue(s)
		return v, v, ok
	}
	if s, ok := r.targetOpt("--xor-mark"); ok {
		v, _, ok := markValue(s)
		return v, 0, ok
	}
	if s, ok := r.targetOpt("--set-mark"); ok {
		v, m, ok := markValue(s)
		return v, m, ok
	}
	return 0, 0, false
}

func hexMark(v uint64) string { return fmt.Sprintf("%#x", v) }

// markMasqDefects checks KUBE-MARK-MASQ's single rule "-j MARK --or-mark M"
// and returns the masquerade mark (from it, else from KUBE-POSTROUTING's
// RETURN rule, else the default).
func markMasqDefects(nat *Table) (string, []Defect) {
	mark := ""
	for _, r := range nat.Chain("KUBE-POSTROUTING").rules() {
		if r.Target == "RETURN" {
			if v, neg, ok := r.Match("mark", "--mark"); ok && neg {
				if val, mask, ok := markValue(v); ok && val == mask && val != 0 {
					mark = hexMark(val)
				}
			}
		}
	}
	c := nat.Chain("KUBE-MARK-MASQ")
	want := func(m string) string { return "-A KUBE-MARK-MASQ -j MARK --set-xmark " + m + "/" + m }
	var out []Defect
	var markRule *Rule
	for i, r := range c.rules() {
		if r.Target == "MARK" {
			markRule = &c.Rules[i]
			break
		}
	}
	switch {
	case c == nil && programsServices(nat):
		m := orDefault(mark)
		return m, []Defect{{Table: "nat", Chain: "KUBE-MARK-MASQ", Check: CheckMarkMasq, Breaks: true, Want: want(m),
			Problem: "chain KUBE-MARK-MASQ missing", Impact: "rules that mark Service traffic for SNAT jump to nothing (kube-proxy's restores fail)"}}
	case c == nil:
		return orDefault(mark), nil
	case markRule == nil:
		m := orDefault(mark)
		return m, []Defect{{Table: "nat", Chain: "KUBE-MARK-MASQ", Check: CheckMarkMasq, Breaks: true, Want: want(m),
			Problem: "mark rule missing", Impact: "Service traffic that needs SNAT (hairpin, off-cluster sources, external traffic) is not masqueraded: replies do not come back"}}
	}
	val, mask, ok := markRule.setMark()
	if ok && val == mask && val != 0 {
		if mark != "" && hexMark(val) != mark {
			out = append(out, Defect{Table: "nat", Chain: "KUBE-MARK-MASQ", Check: CheckMarkMasq, Breaks: true, Rule: markRule.Text("KUBE-MARK-MASQ"), Line: markRule.Line,
				Want: want(mark), Problem: "changed: sets mark " + hexMark(val) + " but KUBE-POSTROUTING masquerades " + mark,
				Impact: "marked Service traffic is not masqueraded"})
			return mark, out
		}
		if conds := markRule.Conditions(); len(conds) > 0 {
			out = append(out, Defect{Table: "nat", Chain: "KUBE-MARK-MASQ", Check: CheckMarkMasq, Breaks: true, Rule: markRule.Text("KUBE-MARK-MASQ"), Line: markRule.Line,
				Want: want(hexMark(val)), Problem: "changed: conditions added (" + strings.Join(conds, " ") + ")",
				Impact: "some traffic jumping to KUBE-MARK-MASQ is not marked for SNAT"})
		}
		return hexMark(val), out
	}
	m := orDefault(mark)
	return m, append(out, Defect{Table: "nat", Chain: "KUBE-MARK-MASQ", Check: CheckMarkMasq, Breaks: true, Rule: markRule.Text("KUBE-MARK-MASQ"), Line: markRule.Line,
		Want: want(m), Problem: "changed: the MARK target no longer ORs the masquerade bit into the mark",
		Impact: "the packet mark is overwritten or the SNAT bit not set: other components' marks are lost or traffic is not masqueraded"})
}

// programsServices reports whether the nat table holds kube-proxy's
// per-Service chains: a whole rule set kube-proxy wrote, in which a missing
// KUBE-MARK-MASQ or KUBE-POSTROUTING chain is a defect (a partial KUBE-*
// set, such as a mode switch's leftovers, is reported by other checks).
func programsServices(nat *Table) bool {
	if nat == nil {
		return false
	}
	for _, c := range nat.Chains {
		if isServiceChain(c.Name) {
			return true
		}
	}
	return false
}

func orDefault(m string) string {
	if m == "" {
		return DefaultMasqueradeMark
	}
	return m
}

func (c *Chain) rules() []Rule {
	if c == nil {
		return nil
	}
	return c.Rules
}

// postroutingDefects checks KUBE-POSTROUTING: "-m mark ! --mark M/M -j
// RETURN", "-j MARK --xor-mark M", "-j MASQUERADE", in that order.
func postroutingDefects(nat *Table, mark string) []Defect {
	c := nat.Chain("KUBE-POSTROUTING")
	if c == nil {
		if !programsServices(nat) {
			return nil
		}
		return []Defect{{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckMasquerade, Breaks: true,
			Want: "-A KUBE-POSTROUTING -j MASQUERADE", Problem: "chain KUBE-POSTROUTING missing",
			Impact: "Service traffic marked for SNAT is never masqueraded: replies from backends on other nodes do not come back"}}
	}
	mm := mark + "/" + mark
	wantRet := "-A KUBE-POSTROUTING -m mark ! --mark " + mm + " -j RETURN"
	wantClear := "-A KUBE-POSTROUTING -j MARK --set-xmark " + mark + "/0x0"
	wantMasq := "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE"
	var out []Defect
	retAt, clearAt, masqAt := -1, -1, -1
	for i, r := range c.Rules {
		text := r.Text("KUBE-POSTROUTING")
		switch r.Target {
		case "RETURN":
			v, neg, ok := r.Match("mark", "--mark")
			switch {
			case !ok && len(r.Conditions()) == 0:
				out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckReturn, Breaks: true, Rule: text, Line: r.Line,
					Missing: []string{"-m mark ! --mark " + mm}, Want: wantRet, Problem: "RETURN lost its mark match",
					Impact: "every packet returns before MASQUERADE: Service traffic that needs SNAT is not masqueraded and its replies do not come back"})
			case !ok || v != mm || !neg:
				out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckReturn, Breaks: true, Rule: text, Line: r.Line,
					Want: wantRet, Problem: "changed: RETURN does not match exactly the packets without mark " + mm,
					Impact: "the wrong packets are masqueraded: marked Service traffic may not be, or unmarked traffic is"})
			}
			if retAt < 0 {
				retAt = i
			}
		case "MARK":
			val, mask, ok := r.setMark()
			if !ok || hexMark(val) != mark || mask != 0 || len(r.Conditions()) > 0 {
				out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckClearMark, Rule: text, Line: r.Line,
					Want: wantClear, Problem: "changed: the rule no longer clears exactly the masquerade bit",
					Impact: "packet marks of other components are changed, or the mark survives and packets are masqueraded again"})
			}
			if clearAt < 0 {
				clearAt = i
			}
		case "MASQUERADE":
			if conds := r.Conditions(); len(conds) > 0 {
				out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckMasquerade, Breaks: true, Rule: text, Line: r.Line,
					Want: wantMasq, Problem: "changed: conditions added (" + strings.Join(conds, " ") + ")",
					Impact: "part of the Service traffic marked for SNAT is not masqueraded"})
			}
			if masqAt < 0 {
				masqAt = i
			}
		}
	}
	if retAt < 0 {
		out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckReturn, Want: wantRet,
			Problem: "RETURN for unmarked packets missing",
			Impact:  "every packet through nat POSTROUTING is masqueraded: backends and the outside see the node's address instead of the client's"})
	}
	if clearAt < 0 {
		out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckClearMark, Want: wantClear,
			Problem: "rule clearing the masquerade bit missing",
			Impact:  "a packet that traverses the stack again keeps the mark and is masqueraded twice"})
	}
	switch {
	case masqAt < 0:
		out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckMasquerade, Breaks: true, Want: wantMasq,
			Problem: "MASQUERADE rule missing",
			Impact:  "Service traffic marked for SNAT (hairpin, off-cluster sources, external traffic) is not masqueraded: replies do not come back"})
	case retAt >= 0 && masqAt < retAt:
		r := c.Rules[masqAt]
		out = append(out, Defect{Table: "nat", Chain: "KUBE-POSTROUTING", Check: CheckMasquerade, Rule: r.Text("KUBE-POSTROUTING"), Line: r.Line,
			Want: wantMasq + " after " + wantRet, Problem: "changed: MASQUERADE comes before the RETURN for unmarked packets",
			Impact: "every packet through nat POSTROUTING is masqueraded"})
	}
	return out
}

// ruleReq is a canonical requirement: rules of chains matching chain with
// a target matching target must carry every condition in all and at least
// one of each group in anyOf.
type ruleReq struct {
	table  string
	chain  func(string) bool
	target func(string) bool
	all    []string
	anyOf  [][]string
	impact string
	// breaks: the rule without its conditions loses traffic (rather than
	// masquerading or accepting more than it should).
	breaks bool
}

func is(names ...string) func(string) bool {
	return func(s string) bool {
		for _, n := range names {
			if s == n {
				return true
			}
		}
		return false
	}
}

func prefixed(ps ...string) func(string) bool {
	return func(s string) bool {
		for _, p := range ps {
			if strings.HasPrefix(s, p) {
				return true
			}
		}
		return false
	}
}

// ruleReqs are the match conditions kube-proxy v1.34 always writes, by
// chain and target (syncProxyRules in proxier.go).
var ruleReqs = []ruleReq{
	{table: "nat", chain: is("KUBE-SERVICES"), target: prefixed("KUBE-SVC-", "KUBE-SVL-", "KUBE-EXT-", "KUBE-FW-"),
		all: []string{"-p", "-d", "--dport"}, impact: "traffic to other destinations or ports is sent to this Service's backends", breaks: true},
	{table: "nat", chain: is("KUBE-SERVICES"), target: is("KUBE-NODEPORTS"),
		anyOf: [][]string{{"--dst-type LOCAL", "-d"}}, impact: "traffic to any address is matched against NodePorts", breaks: true},
	{table: "nat", chain: is("KUBE-NODEPORTS"), target: prefixed("KUBE-EXT-", "KUBE-SVC-", "KUBE-SVL-"),
		all: []string{"-p", "--dport"}, impact: "traffic to other node ports is sent to this Service's backends", breaks: true},
	{table: "nat", chain: prefixed("KUBE-SVC-", "KUBE-SVL-"), target: is("KUBE-MARK-MASQ"),
		all: []string{"-d", "--dport"}, impact: "traffic is masqueraded that should keep its source address", breaks: false},
	{table: "nat", chain: prefixed("KUBE-FW-"), target: prefixed("KUBE-EXT-"),
		all: []string{"-s"}, impact: "loadBalancerSourceRanges no longer restrict who reaches the Service", breaks: false},
	{table: "nat", chain: prefixed("KUBE-SEP-"), target: is("KUBE-MARK-MASQ"),
		all: []string{"-s"}, impact: "all traffic to this endpoint is masqueraded, not only hairpin traffic: backends lose the client address", breaks: false},
	{table: "nat", chain: prefixed("KUBE-SEP-"), target: is("DNAT"),
		all: []string{"-p"}, impact: "traffic of every protocol is DNATed to this endpoint's port", breaks: true},
	{table: "filter", chain: is("KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES"), target: is("REJECT", "DROP"),
		all: []string{"-p", "--dport"}, anyOf: [][]string{{"-d", "--dst-type LOCAL"}}, impact: "traffic to other Services, ports or hosts is rejected or dropped", breaks: true},
	{table: "filter", chain: is("KUBE-PROXY-FIREWALL"), target: is("DROP"),
		all: []string{"-p", "-d", "--dport"}, impact: "traffic to other destinations is dropped", breaks: true},
	{table: "filter", chain: is("KUBE-NODEPORTS"), target: is("ACCEPT"),
		all: []string{"-p", "--dport"}, impact: "every packet to the node is accepted, bypassing the host firewall", breaks: false},
	{table: "filter", chain: is("KUBE-FORWARD"), target: is("DROP"),
		all: []string{"--ctstate INVALID"}, impact: "every forwarded packet is dropped: pods lose connectivity across the node", breaks: true},
	{table: "filter", chain: is("KUBE-FORWARD"), target: is("ACCEPT"),
		anyOf: [][]string{{"--mark", "--ctstate RELATED,ESTABLISHED"}}, impact: "every forwarded packet is accepted, bypassing the FORWARD policy and NetworkPolicy in FORWARD after it", breaks: false},
	{table: "filter", chain: is("KUBE-FIREWALL"), target: is("DROP"),
		anyOf: [][]string{{"--mark", "-d 127.0.0.0/8"}}, impact: "packets that should pass are dropped", breaks: true},
}

// verdicts are targets that end a packet's traversal.
var verdicts = map[string]bool{"DROP": true, "REJECT": true, "ACCEPT": true, "DNAT": true, "SNAT": true, "MASQUERADE": true}

func ruleDefects(table string, c *Chain, mark string, o DefectOptions, buf *ruleOpts) []Defect {
	var out []Defect
	for i, r := range c.Rules {
		if table == "filter" && c.Name == "KUBE-FIREWALL" && r.Target == "DROP" && !r.hasConditions() && o.SkipBareFirewallDrop {
			continue
		}
		text := func() string { return r.Text(c.Name) }
		matched := false
		for _, q := range ruleReqs {
			if q.table != table || !q.chain(c.Name) || !q.target(r.Target) {
				continue
			}
			matched = true
			*buf = r.appendOpts((*buf)[:0])
			ro := *buf
			miss := ro.missing(q.all)
			for _, group := range q.anyOf {
				okAny := false
				for _, g := range group {
					if ro.has(g) || ro.has("! "+g) {
						okAny = true
						break
					}
				}
				if !okAny {
					miss = append(miss, strings.Join(group, " or "))
				}
			}
			if c.Name == "KUBE-FIREWALL" && ro.has("-d 127.0.0.0/8") {
				// kubelet's and kube-proxy's localnet rule: all three
				// conditions, or it drops loopback traffic.
				miss = append(miss, ro.missing([]string{"! -s 127.0.0.0/8", "! --ctstate RELATED,ESTABLISHED,DNAT"})...)
			}
			if c.Name == "KUBE-FORWARD" && r.Target == "ACCEPT" && ro.has("--mark") && markOpt(ro) != mark+"/"+mark {
				out = append(out, Defect{Table: table, Chain: c.Name, Check: CheckLostMatch, Rule: text(), Line: r.Line,
					Want: "-m mark --mark " + mark + "/" + mark, Problem: "changed: accepts mark " + markOpt(ro) + ", not the masquerade mark " + mark + "/" + mark,
					Impact: "forwarded Service traffic marked for SNAT is not accepted when the FORWARD policy drops", Breaks: true})
			}
			if len(miss) > 0 {
				out = append(out, Defect{Table: table, Chain: c.Name, Check: CheckLostMatch, Rule: text(), Line: r.Line,
					Missing: miss, Want: "conditions " + strings.Join(append(append([]string(nil), q.all...), flatten(q.anyOf)...), ", "),
					Problem: "lost its match conditions", Impact: q.impact, Breaks: q.breaks})
			}
			break
		}
		if !matched && verdicts[r.Target] && !r.hasConditions() && !(table == "nat" && strings.HasPrefix(c.Name, "KUBE-SEP-")) {
			out = append(out, Defect{Table: table, Chain: c.Name, Check: CheckLostMatch, Rule: text(), Line: r.Line,
				Want:    "kube-proxy writes no unconditional " + r.Target + " in " + ChainGroup(c.Name),
				Problem: "unconditional " + r.Target, Impact: "every packet reaching " + c.Name + " gets " + r.Target, Breaks: r.Target != "ACCEPT"})
		}
		if table == "nat" && isServiceChain(c.Name) && !strings.HasPrefix(c.Name, "KUBE-SEP-") && i < len(c.Rules)-1 &&
			r.Target != "KUBE-MARK-MASQ" && r.Target != "" && !r.hasConditions() && shadowsRest(c.Rules[i+1:]) {
			out = append(out, Defect{Table: table, Chain: c.Name, Check: CheckShadowed, Rule: text(), Line: r.Line,
				Want:    "only the last jump of " + ChainGroup(c.Name) + " is unconditional",
				Problem: fmt.Sprintf("unconditional jump to %s is followed by %d rule(s) it makes unreachable", r.Target, len(c.Rules)-1-i),
				Impact:  "a load-balancing or traffic-policy rule lost its match: every packet takes the first path (one endpoint gets all traffic, or a traffic policy is ignored)", Breaks: true})
		}
	}
	return out
}

func markOpt(o ruleOpts) string {
	v, _ := o.get("--mark")
	return v.val
}

// shadowsRest reports whether any later rule has a jump target (a
// comment-only rule, like the end of a KUBE-FW-* chain, is not shadowed).
func shadowsRest(rest []Rule) bool {
	for _, r := range rest {
		if r.Target != "" {
			return true
		}
	}
	return false
}

func flatten(groups [][]string) []string {
	var out []string
	for _, g := range groups {
		out = append(out, strings.Join(g, " or "))
	}
	return out
}
