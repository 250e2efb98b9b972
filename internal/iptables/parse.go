package iptables

import (
	"fmt"
	"io"
	"strings"
)

// Ruleset is a parsed iptables-save output: its tables in output order.
type Ruleset struct {
	Tables []*Table
	// Warnings are "# Warning: ..." comment lines (iptables-nft-save
	// prints "# Warning: iptables-legacy tables present, use
	// iptables-legacy-save to see them").
	Warnings []string
}

// Table is one "*name ... COMMIT" block.
type Table struct {
	Name   string
	Chains []*Chain
	byName map[string]*Chain
}

// Chain is a chain declaration with its rules in order.
type Chain struct {
	Name string
	// Policy is ACCEPT/DROP for built-in chains, "-" for user chains.
	Policy string
	Rules  []Rule
}

// Builtin reports whether this is a built-in chain (it has a policy).
func (c *Chain) Builtin() bool { return c.Policy != "-" }

// Rule is one "-A CHAIN ..." line.
type Rule struct {
	// Line is the 1-based line number in the save output.
	Line int
	// Args are the rule's tokens after "-A CHAIN", unquoted.
	Args []string
	// Target is the argument of -j or -g ("" when the rule has none).
	Target string
	// Goto is true when the target was given with -g.
	Goto bool
}

// Table returns the table with that name, or nil.
func (r *Ruleset) Table(name string) *Table {
	for _, t := range r.Tables {
		if t.Name == name {
			return t
		}
	}
	return nil
}

// Chain returns the chain with that name, or nil.
func (t *Table) Chain(name string) *Chain {
	if t == nil {
		return nil
	}
	return t.byName[name]
}

// RuleCount is the number of rules in all tables.
func (r *Ruleset) RuleCount() int {
	n := 0
	for _, t := range r.Tables {
		for _, c := range t.Chains {
			n += len(c.Rules)
		}
	}
	return n
}

// KubeRuleCount counts Kubernetes rules: rules in a KUBE-* chain or jumping
// to one.
func (r *Ruleset) KubeRuleCount() int {
	n := 0
	for _, t := range r.Tables {
		for _, c := range t.Chains {
			if IsKube(c.Name) {
				n += len(c.Rules)
				continue
			}
			for _, rl := range c.Rules {
				if IsKube(rl.Target) {
					n++
				}
			}
		}
	}
	return n
}

// KubeChains counts KUBE-* chains over all tables.
func (r *Ruleset) KubeChains() int {
	n := 0
	for _, t := range r.Tables {
		for _, c := range t.Chains {
			if IsKube(c.Name) {
				n++
			}
		}
	}
	return n
}

// IsKube reports whether a chain name belongs to Kubernetes (KUBE-*).
func IsKube(chain string) bool { return strings.HasPrefix(chain, "KUBE-") }

// JumpsTo reports whether any rule of the chain jumps (or goes) to target.
func (c *Chain) JumpsTo(target string) bool {
	if c == nil {
		return false
	}
	for _, r := range c.Rules {
		if r.Target == target {
			return true
		}
	}
	return false
}

// Match returns the value of option opt ("--mark") of match module m
// ("mark") and whether the option is negated; ok is false when the rule has
// no such match option.
func (r Rule) Match(m, opt string) (value string, negated, ok bool) {
	in := false
	for i := 0; i < len(r.Args); i++ {
		a := r.Args[i]
		switch {
		case a == "-m" || a == "--match":
			in = i+1 < len(r.Args) && r.Args[i+1] == m
			i++
		case a == "-j" || a == "-g":
			in = false
		case in && a == opt:
			neg := i > 0 && r.Args[i-1] == "!"
			if i+1 < len(r.Args) {
				return r.Args[i+1], neg, true
			}
			return "", neg, true
		}
	}
	return "", false, false
}

// Conditions returns the rule's selecting arguments: everything before the
// -j/-g target except comment matches. A rule without conditions matches
// every packet.
func (r Rule) Conditions() []string {
	var out []string
	for i := 0; i < len(r.Args); i++ {
		a := r.Args[i]
		if a == "-j" || a == "-g" {
			break
		}
		if (a == "-m" || a == "--match") && i+1 < len(r.Args) && r.Args[i+1] == "comment" {
			i++ // skip "comment"
			for i+1 < len(r.Args) && r.Args[i+1] == "--comment" {
				i += 2
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

// Parse reads iptables-save output. It accepts what iptables-save
// (legacy and nft) print: comments, "*table", ":CHAIN POLICY [p:b]",
// "-A CHAIN args", "COMMIT". Anything else, a rule outside a table or in an
// undeclared chain, or a table without COMMIT is an error naming the line.
func Parse(rd io.Reader) (*Ruleset, error) {
	b, err := io.ReadAll(rd)
	if err != nil {
		return nil, fmt.Errorf("reading iptables-save output: %w", err)
	}
	return ParseString(string(b))
}

// ParseString is Parse of a string; rule tokens are substrings of text, so
// a large save costs one copy of its text plus the per-rule slices.
func ParseString(text string) (*Ruleset, error) {
	rs := &Ruleset{}
	var cur *Table
	var arena []string // rule tokens are carved from shared blocks
	n := 0
	for len(text) > 0 {
		n++
		var line string
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			line, text = text, ""
		}
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			continue
		}
		switch line[0] {
		case '#':
			if strings.HasPrefix(line, "# Warning:") {
				rs.Warnings = append(rs.Warnings, strings.TrimSpace(strings.TrimPrefix(line, "#")))
			}
		case '*':
			if cur != nil {
				return nil, fmt.Errorf("line %d: table %q starts before table %q is committed", n, line[1:], cur.Name)
			}
			name := strings.TrimSpace(line[1:])
			if name == "" || strings.ContainsAny(name, " \t") {
				return nil, fmt.Errorf("line %d: bad table line %q", n, line)
			}
			if rs.Table(name) != nil {
				return nil, fmt.Errorf("line %d: table %q appears twice", n, name)
			}
			cur = &Table{Name: name, byName: map[string]*Chain{}}
		case ':':
			if cur == nil {
				return nil, fmt.Errorf("line %d: chain declared outside a table", n)
			}
			f := strings.Fields(line[1:])
			if len(f) < 2 || len(f) > 3 {
				return nil, fmt.Errorf("line %d: bad chain line %q", n, line)
			}
			if _, dup := cur.byName[f[0]]; dup {
				return nil, fmt.Errorf("line %d: chain %s declared twice", n, f[0])
			}
			c := &Chain{Name: f[0], Policy: f[1]}
			cur.Chains = append(cur.Chains, c)
			cur.byName[c.Name] = c
		case '-':
			if cur == nil {
				return nil, fmt.Errorf("line %d: rule outside a table", n)
			}
			args, err := splitArgs(line, &arena)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n, err)
			}
			if len(args) < 2 || args[0] != "-A" {
				return nil, fmt.Errorf("line %d: not an append rule: %q", n, line)
			}
			c := cur.byName[args[1]]
			if c == nil {
				return nil, fmt.Errorf("line %d: rule in undeclared chain %q", n, args[1])
			}
			r := Rule{Line: n, Args: args[2:]}
			for i := 0; i+1 < len(r.Args); i++ {
				if r.Args[i] == "-j" || r.Args[i] == "-g" || r.Args[i] == "--jump" || r.Args[i] == "--goto" {
					r.Target = r.Args[i+1]
					r.Goto = r.Args[i] == "-g" || r.Args[i] == "--goto"
					break
				}
			}
			c.Rules = append(c.Rules, r)
		default:
			if line == "COMMIT" {
				if cur == nil {
					return nil, fmt.Errorf("line %d: COMMIT outside a table", n)
				}
				rs.Tables = append(rs.Tables, cur)
				cur = nil
				continue
			}
			return nil, fmt.Errorf("line %d: unexpected %q", n, truncate(line))
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("table %q not committed (truncated output?)", cur.Name)
	}
	return rs, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// splitArgs splits a rule line into tokens the way iptables-save quotes
// them: space-separated, with "double quoted" strings in which \" and \\
// are escapes. Unquoted tokens are substrings of line (no copy). The
// returned slice is carved from *arena (full capacity-limited, so appending
// to it never touches a neighbour).
func splitArgs(line string, arena *[]string) ([]string, error) {
	if cap(*arena)-len(*arena) < 64 {
		*arena = make([]string, 0, 4096)
	}
	start := len(*arena)
	args := (*arena)[start:start]
	i := 0
	for i < len(line) {
		for i < len(line) && line[i] == ' ' {
			i++
		}
		if i >= len(line) {
			break
		}
		if line[i] != '"' {
			j := i
			for j < len(line) && line[j] != ' ' {
				j++
			}
			args = append(args, line[i:j])
			i = j
			continue
		}
		// Quoted.
		i++
		j := i
		simple := true
		for j < len(line) && line[j] != '"' {
			if line[j] == '\\' {
				simple = false
				j++
			}
			j++
		}
		if j >= len(line) {
			return nil, fmt.Errorf("unterminated quote in %q", truncate(line))
		}
		if simple {
			args = append(args, line[i:j])
		} else {
			var b strings.Builder
			for k := i; k < j; k++ {
				if line[k] == '\\' && k+1 < j {
					k++
				}
				b.WriteByte(line[k])
			}
			args = append(args, b.String())
		}
		i = j + 1
	}
	if len(args) > cap(*arena)-start {
		// Grew past the block (a very long rule): it was reallocated
		// on its own; leave the arena as it was.
		return args[:len(args):len(args)], nil
	}
	*arena = (*arena)[:start+len(args)]
	return args[:len(args):len(args)], nil
}
