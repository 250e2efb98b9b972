package policy

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/remediate-dev/remediate/internal/boundedfile"
	"io"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"

	goccy "github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/lexer"
	goccyparser "github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
	"github.com/hashicorp/go-multierror"
	"gopkg.in/yaml.v3"
)

// Error is one problem in a policy file, with its position.
type Error struct {
	File   string
	Line   int
	Column int
	// Path is the field path, e.g. "rules[2].action.factor".
	Path string
	Msg  string
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d:%d", e.Line, e.Column)
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors returns the individual *Error values of an error returned by Load
// (which is a *multierror.Error of them), or nil.
func Errors(err error) []*Error {
	var me *multierror.Error
	if errors.As(err, &me) {
		out := make([]*Error, 0, len(me.Errors))
		for _, e := range me.Errors {
			var pe *Error
			if errors.As(e, &pe) {
				out = append(out, pe)
			}
		}
		return out
	}
	var pe *Error
	if errors.As(err, &pe) {
		return []*Error{pe}
	}
	return nil
}

func formatErrors(es []error) string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// MaxSize is the largest policy file Load accepts.
const MaxSize = 1 << 20

// MaxItems bounds the lines and flow items ('\n', ',', '[', '{') of a
// policy, checked on the bytes before parsing: parsing costs memory per
// value, and a 1 MiB file of "*a," items would take hundreds of MB.
const MaxItems = 20000

// MaxNodes bounds the values of a policy with aliases expanded ("billion
// laughs": a few anchors referring to each other).
const MaxNodes = 50000

// structuralCount is an upper bound of the values a YAML text can have
// up to a constant factor, counted without parsing it.
func structuralCount(data []byte) int {
	n := 0
	for _, c := range data {
		switch c {
		case '\n', ',', '[', '{':
			n++
		}
	}
	return n
}

// expandedNodes counts n's values as the decoder will visit them (aliases
// followed), stopping as soon as the count exceeds limit.
func expandedNodes(n *yaml.Node, limit int) int {
	count := 0
	var walk func(n *yaml.Node, depth int)
	walk = func(n *yaml.Node, depth int) {
		if n == nil || count > limit {
			return
		}
		if depth > 100 {
			count = limit + 1
			return
		}
		count++
		if n.Kind == yaml.AliasNode {
			walk(n.Alias, depth+1)
			return
		}
		for _, c := range n.Content {
			walk(c, depth+1)
		}
	}
	walk(n, 0)
	return count
}

// Load reads, decodes, defaults and validates the policy file at path.
// On any problem it returns a *multierror.Error listing every *Error found.
func Load(path string, cat Catalog) (*Policy, error) {
	// Bounded: a FIFO, a device or a huge file swapped in for the policy
	// is refused at once, not waited on or read into memory. Symlinks are
	// followed: the kubelet mounts a ConfigMap as links to ..data.
	data, err := boundedfile.Read(path, MaxSize)
	if err != nil {
		return nil, fmt.Errorf("reading policy: %w", err)
	}
	return Parse(path, data, cat)
}

// Parse is Load on bytes; name is used in error positions.
func Parse(name string, data []byte, cat Catalog) (*Policy, error) {
	d := &decoder{file: name, cat: cat, pos: map[string]*yaml.Node{}, failed: map[string]bool{}}
	if len(data) > MaxSize {
		return nil, d.fail(&Error{File: name, Msg: fmt.Sprintf("file larger than %d bytes", MaxSize)})
	}
	if n := structuralCount(data); n > MaxItems {
		return nil, d.fail(&Error{File: name, Msg: fmt.Sprintf("more than %d lines and list/map items (%d): a policy is a few hundred lines", MaxItems, n)})
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, d.fail(&Error{File: name, Msg: "empty policy: expected a RemediationPolicy document"})
		}
		return nil, d.fail(yamlSyntaxError(name, data, err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, d.fail(&Error{File: name, Line: extra.Line, Column: extra.Column, Msg: "a policy file holds exactly one YAML document"})
	} else if !errors.Is(err, io.EOF) {
		return nil, d.fail(yamlSyntaxError(name, data, err))
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if expandedNodes(root, MaxNodes) > MaxNodes {
		return nil, d.fail(&Error{File: name, Msg: fmt.Sprintf("more than %d values once aliases are expanded: refusing to expand it", MaxNodes)})
	}
	p := &Policy{}
	p.setDefaults()
	d.decode(root, reflect.ValueOf(p).Elem(), "")
	// Validate even when decoding failed somewhere, so that every error of
	// the file is reported at once; errAt drops errors on fields that
	// already failed to decode.
	written := func(path string) bool { _, ok := d.pos[path]; return ok }
	for _, fe := range validatePolicy(p, written) {
		d.errAt(fe.Field, fe.Msg)
	}
	d.checkPairs(p)
	if len(d.errs) > 0 {
		return nil, d.result()
	}
	p.Notes = d.notes
	return p, nil
}

// checkPairs refuses rules whose detector cannot feed their action, when
// the catalog can tell.
func (d *decoder) checkPairs(p *Policy) {
	pc, ok := d.cat.(PairChecker)
	if !ok {
		return
	}
	for i, r := range p.Rules {
		if r.Action == nil || r.Detector.Params == nil || r.Action.Params == nil {
			continue // unknown type: already reported
		}
		if msg := pc.CheckPair(r.Detector.Type, r.Action.Type); msg != "" {
			d.errAt(fmt.Sprintf("rules[%d].action.type", i), msg)
		}
	}
}

// yamlSyntaxError is a syntax error at the parser's own position. yaml.v3
// names a line only, and for parser errors it is the 0-based line of the
// error's context (the collection being parsed), column always 1: an
// unclosed '{' at 6:13 read "line 5", a bad indent at 8:4 "line 4". The
// position is taken from a second parser (goccy/go-yaml) that keeps the
// offending token's line and column; yaml.v3's message is kept (it names
// what was expected). When yaml.v3's context is an unclosed flow
// collection ("did not find expected ',' or '}'"), its own position is
// the answer: the '{' or '[' that is not closed, on yaml.v3's context line
// (unclosedFlow), and the message says where the parser stopped. Should
// goccy/go-yaml accept what yaml.v3 refused, yaml.v3's line is said
// without a column, made 1-based for a parser error (yamlParserProblems).
func yamlSyntaxError(name string, data []byte, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	near := 0
	// yaml.v3 syntax errors read "line N: ...".
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.Index(rest, ":"); i > 0 {
			if n, convErr := strconv.Atoi(rest[:i]); convErr == nil {
				near, msg = n, strings.TrimSpace(rest[i+1:])
			}
		}
	}
	if yamlParserProblems[msg] {
		// The parser's line is 0-based, and unsaid on the first line.
		near++
	}
	e := &Error{File: name, Msg: msg}
	if line, col, ok := syntaxPosition(data); ok {
		e.Line, e.Column = line, col
		if kind, open := flowCloserExpected(msg); open {
			if ol, oc, ok := unclosedFlow(data, kind, line, col, near); ok {
				e.Line, e.Column = ol, oc
				e.Msg = fmt.Sprintf("%s (the '%c' here is not closed before %d:%d)", msg, kind, line, col)
			}
		}
	} else if near > 0 {
		e.Msg = fmt.Sprintf("%s (near line %d)", msg, near)
	}
	return e
}

// yamlParserProblems are the problems yaml.v3's parser reports
// (parserc.go, yaml_parser_set_parser_error*). It says their line as its
// 0-based mark ("line 5" for line 6; nothing for line 1), while a scanner
// error's line is 1-based: parser.fail in decode.go adds 1 for scanner
// errors only. Pinned with gopkg.in/yaml.v3 v3.0.1.
var yamlParserProblems = map[string]bool{
	"did not find expected <stream-start>":   true,
	"did not find expected <document start>": true,
	"found duplicate %YAML directive":        true,
	"found incompatible YAML document":       true,
	"found duplicate %TAG directive":         true,
	"found undefined tag handle":             true,
	"did not find expected node content":     true,
	"did not find expected key":              true,
	"did not find expected '-' indicator":    true,
	"did not find expected ',' or ']'":       true,
	"did not find expected ',' or '}'":       true,
}

// syntaxPosition is where goccy/go-yaml's parser stops on data (1-based
// line and column), or false if it parses data. It only parses (no alias
// is expanded; data is already bounded by MaxSize and MaxItems), and a
// panic of that parser on hostile input is no position, not a crash.
func syntaxPosition(data []byte) (line, col int, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			line, col, ok = 0, 0, false
		}
	}()
	_, err := goccyparser.ParseBytes(data, 0)
	var se *goccy.SyntaxError
	if err == nil || !errors.As(err, &se) {
		return 0, 0, false
	}
	tk := se.GetToken()
	if tk == nil || tk.Position == nil || tk.Position.Line < 1 {
		return 0, 0, false
	}
	return tk.Position.Line, max(tk.Position.Column, 1), true
}

// flowCloserExpected reports which flow collection a yaml.v3 message says
// is not closed: '{' for "did not find expected ',' or '}'", '[' for
// "... or ']'".
func flowCloserExpected(msg string) (open byte, ok bool) {
	switch msg {
	case "did not find expected ',' or '}'":
		return '{', true
	case "did not find expected ',' or ']'":
		return '[', true
	}
	return 0, false
}

// unclosedFlow is the position (1-based) of the flow collection still open
// where the parser stopped (stopLine:stopCol, goccy/go-yaml's position):
// the innermost '{' or '[' opened before it and not closed. It is the
// answer only if it is of the kind yaml.v3 expected to close (open) and on
// yaml.v3's context line (contextLine, 1-based; yaml.v3 names no line for a
// context on line 1); otherwise false, and the caller keeps the stop
// position. data has parsed once already (syntaxPosition), so tokenizing
// it again is bounded the same way; a panic is no position.
func unclosedFlow(data []byte, open byte, stopLine, stopCol, contextLine int) (line, col int, ok bool) {
	defer func() {
		if r := recover(); r != nil {
			line, col, ok = 0, 0, false
		}
	}()
	type opener struct {
		kind      byte
		line, col int
	}
	var stack []opener
	for _, tk := range lexer.Tokenize(string(data)) {
		if tk == nil || tk.Position == nil {
			continue
		}
		if p := tk.Position; p.Line > stopLine || (p.Line == stopLine && p.Column >= stopCol) {
			break
		}
		switch tk.Type {
		case token.MappingStartType:
			stack = append(stack, opener{'{', tk.Position.Line, tk.Position.Column})
		case token.SequenceStartType:
			stack = append(stack, opener{'[', tk.Position.Line, tk.Position.Column})
		case token.MappingEndType, token.SequenceEndType:
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
		}
	}
	if len(stack) == 0 {
		return 0, 0, false
	}
	top := stack[len(stack)-1]
	if top.kind != open || top.line < 1 || top.col < 1 || (top.line != contextLine && top.line != 1) {
		return 0, 0, false
	}
	// The lexer's column counts runes; said only if the file has that very
	// bracket there (after a tag, for one, the lexer's column is off).
	lines := bytes.Split(data, []byte("\n"))
	if top.line > len(lines) {
		return 0, 0, false
	}
	if l := []rune(string(lines[top.line-1])); top.col > len(l) || l[top.col-1] != rune(open) {
		return 0, 0, false
	}
	return top.line, top.col, true
}

type decoder struct {
	file string
	cat  Catalog
	errs []error
	pos  map[string]*yaml.Node
	// failed holds the paths that already have an error.
	failed map[string]bool
	// notes are said about a policy without refusing it (Policy.Notes).
	notes []*Error
}

func (d *decoder) fail(e *Error) error {
	d.errs = append(d.errs, e)
	return d.result()
}

func (d *decoder) result() error {
	sort.SliceStable(d.errs, func(i, j int) bool {
		a, b := d.errs[i].(*Error), d.errs[j].(*Error)
		if a.Line != b.Line {
			return a.Line < b.Line
		}
		return a.Column < b.Column
	})
	return &multierror.Error{Errors: d.errs, ErrorFormat: formatErrors}
}

func (d *decoder) errorf(n *yaml.Node, path, format string, args ...any) {
	e := &Error{File: d.file, Path: path, Msg: fmt.Sprintf(format, args...)}
	d.failed[path] = true
	if n != nil {
		e.Line, e.Column = n.Line, n.Column
	}
	d.errs = append(d.errs, e)
}

// errAt reports a validation error at path, positioned at the node recorded
// for path or, when the field was not written (a default), its nearest
// written parent.
func (d *decoder) errAt(path, msg string) {
	for q := path; ; q = parentPath(q) {
		if d.failed[q] {
			return // already reported while decoding
		}
		if q == "" {
			break
		}
	}
	p := path
	for {
		if n, ok := d.pos[p]; ok {
			d.errorf(n, path, "%s", msg)
			return
		}
		if p == "" {
			d.errorf(nil, path, "%s", msg)
			return
		}
		p = parentPath(p)
	}
}

func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var (
	unmarshalerType = reflect.TypeOf((*yaml.Unmarshaler)(nil)).Elem()
	componentType   = reflect.TypeOf(Component{})
)

// defaulter is implemented by policy types whose zero value is not their
// default; the decoder calls it on every freshly allocated value so that
// fields absent from the file keep their defaults.
type defaulter interface{ setDefaults() }

func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	d.pos[path] = n
	if v.CanAddr() && v.Addr().Type().Implements(unmarshalerType) {
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.errorf(n, path, "%s", cleanYAMLErr(err))
		}
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if isNull(n) {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		nv := reflect.New(v.Type().Elem())
		if df, ok := nv.Interface().(defaulter); ok {
			df.setDefaults()
		}
		d.decode(n, nv.Elem(), path)
		v.Set(nv)
	case reflect.Struct:
		if v.Type() == componentType {
			d.decodeComponent(n, v, path)
			return
		}
		d.decodeStruct(n, v, path)
	case reflect.Slice:
		if isNull(n) {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		if n.Kind != yaml.SequenceNode {
			d.errorf(n, path, "must be a list")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, c := range n.Content {
			ev := s.Index(i)
			if df, ok := ev.Addr().Interface().(defaulter); ok {
				df.setDefaults()
			}
			d.decode(c, ev, fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	case reflect.Map:
		if isNull(n) {
			v.Set(reflect.Zero(v.Type()))
			return
		}
		if n.Kind != yaml.MappingNode || v.Type().Key().Kind() != reflect.String {
			d.errorf(n, path, "must be a mapping")
			return
		}
		m := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			ev := reflect.New(v.Type().Elem()).Elem()
			d.decode(val, ev, join(path, k.Value))
			m.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), ev)
		}
		v.Set(m)
	case reflect.Interface:
		var x any
		if err := n.Decode(&x); err != nil {
			d.errorf(n, path, "%s", cleanYAMLErr(err))
			return
		}
		if x != nil {
			v.Set(reflect.ValueOf(x))
		}
	default:
		if n.Kind != yaml.ScalarNode {
			d.errorf(n, path, "must be %s", kindName(v.Kind()))
			return
		}
		if err := n.Decode(v.Addr().Interface()); err != nil {
			d.errorf(n, path, "must be %s, got %q", kindName(v.Kind()), n.Value)
			return
		}
		// NaN compares false with every bound and Inf passes "> 0": no
		// validation below could catch them.
		if (v.Kind() == reflect.Float32 || v.Kind() == reflect.Float64) && (math.IsNaN(v.Float()) || math.IsInf(v.Float(), 0)) {
			d.errorf(n, path, "must be a finite number, got %q", n.Value)
		}
	}
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func kindName(k reflect.Kind) string {
	switch k {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "an integer"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	}
	return "a " + k.String()
}

func cleanYAMLErr(err error) string {
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg := te.Errors[0]
		if i := strings.Index(msg, ": "); strings.HasPrefix(msg, "line ") && i > 0 {
			msg = msg[i+2:]
		}
		return msg
	}
	return strings.TrimPrefix(err.Error(), "yaml: ")
}

type fieldInfo struct {
	index []int
	name  string
}

// structFields lists a struct's YAML keys, following `,inline` embedding.
func structFields(t reflect.Type) []fieldInfo {
	var out []fieldInfo
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") && f.Type.Kind() == reflect.Struct {
			for _, sub := range structFields(f.Type) {
				out = append(out, fieldInfo{index: append([]int{i}, sub.index...), name: sub.name})
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out = append(out, fieldInfo{index: []int{i}, name: name})
	}
	return out
}

func fieldNames(fs []fieldInfo) string {
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	return strings.Join(names, ", ")
}

func (d *decoder) decodeStruct(n *yaml.Node, v reflect.Value, path string) {
	if isNull(n) {
		return
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "must be a mapping")
		return
	}
	d.decodeFields(n.Content, v, path, "")
}

// decodeFields decodes mapping key/value pairs into struct v. owner names
// the detector/action type in messages about unknown keys.
func (d *decoder) decodeFields(pairs []*yaml.Node, v reflect.Value, path, owner string) {
	fields := structFields(v.Type())
	byName := make(map[string]fieldInfo, len(fields))
	for _, f := range fields {
		byName[f.name] = f
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(pairs); i += 2 {
		k, val := pairs[i], pairs[i+1]
		kp := join(path, k.Value)
		if seen[k.Value] {
			d.errorf(k, kp, "duplicate key")
			continue
		}
		seen[k.Value] = true
		f, ok := byName[k.Value]
		if !ok {
			what := "field"
			if owner != "" {
				what = "parameter for " + owner
			}
			if len(fields) == 0 {
				d.errorf(k, kp, "unknown %s %q (it takes no parameters)", what, k.Value)
			} else {
				d.errorf(k, kp, "unknown %s %q (valid: %s)", what, k.Value, fieldNames(fields))
			}
			continue
		}
		d.decode(val, v.FieldByIndex(f.index), kp)
	}
}

// decodeComponent decodes a detector or action reference: `type` plus the
// type's parameters inline.
func (d *decoder) decodeComponent(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, path, "must be a mapping with a type, e.g. {type: %s}", exampleType(path))
		return
	}
	kind := "detector"
	newParams, types := d.cat.NewDetectorParams, d.cat.DetectorTypes
	if strings.HasSuffix(path, ".action") {
		kind = "action"
		newParams, types = d.cat.NewActionParams, d.cat.ActionTypes
	}
	var typeNode *yaml.Node
	var rest []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "type" {
			typeNode = n.Content[i+1]
			d.pos[join(path, "type")] = typeNode
			continue
		}
		rest = append(rest, n.Content[i], n.Content[i+1])
	}
	if typeNode == nil || typeNode.Value == "" {
		d.errorf(n, join(path, "type"), "required: the %s type (one of: %s)", kind, strings.Join(types(), ", "))
		d.failed[path] = true
		return
	}
	typ := typeNode.Value
	comp := v.Addr().Interface().(*Component)
	comp.Type = typ
	params, ok := newParams(typ)
	if !ok {
		d.errorf(typeNode, join(path, "type"), "unknown %s type %q (known: %s)", kind, typ, strings.Join(types(), ", "))
		return
	}
	comp.Params = params
	if dc, ok := d.cat.(Deprecator); ok && kind == "action" {
		if note := dc.DeprecatedAction(typ); note != "" {
			d.notes = append(d.notes, &Error{File: d.file, Line: typeNode.Line, Column: typeNode.Column, Path: join(path, "type"), Msg: note})
		}
	}
	if params == nil {
		return
	}
	pv := reflect.ValueOf(params)
	if pv.Kind() != reflect.Pointer || pv.Elem().Kind() != reflect.Struct {
		d.errorf(typeNode, path, "internal error: %s %s parameters are %T, not a pointer to struct", kind, typ, params)
		return
	}
	before := len(d.errs)
	d.decodeFields(rest, pv.Elem(), path, kind+" "+typ)
	if len(d.errs) > before {
		return
	}
	if val, ok := params.(Validator); ok {
		for _, fe := range val.Validate() {
			msg := fe.Msg
			if _, written := d.pos[join(path, fe.Field)]; !written {
				if note, ok := defaultNote(pv.Elem(), fe.Field); ok {
					msg += " " + note
				}
			}
			d.errAt(join(path, fe.Field), msg)
		}
	}
}

func exampleType(path string) string {
	if strings.HasSuffix(path, ".action") {
		return "KillProcess"
	}
	return "HungIPTablesRestore"
}
