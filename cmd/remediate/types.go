package main

import (
	"fmt"
	"io"
	"path"
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/remediate-dev/remediate/detect"
	"github.com/remediate-dev/remediate/remediate"
	"github.com/remediate-dev/remediate/remediate/action"
)

//go:generate go test -run TestParamDocsUpToDate -update .

// writeTypes lists every detector and action type with its parameters:
// YAML name, type, default and meaning (the field's doc comment, see
// paramdocs_gen.go).
func writeTypes(w io.Writer) error {
	fmt.Fprintln(w, "DETECTORS (rules[].detector.type):")
	for _, t := range detect.Types() {
		fmt.Fprintf(w, "\n  %s\n", t.Name)
		writeWrapped(w, "    ", t.Doc)
		fmt.Fprintf(w, "    reports: %s\n", remediate.KindList(t.Targets))
		fmt.Fprintf(w, "    runbook: %s\n", runbookAnchor("detector", t.Name))
		writeParams(w, t.NewParams())
	}
	fmt.Fprintln(w, "\nACTIONS (rules[].action.type):")
	for _, t := range action.Types() {
		fmt.Fprintf(w, "\n  %s\n", t.Name)
		d := t.Doc
		if t.Disruptive {
			d += " [disruptive: needs a cluster budget slot]"
		}
		if t.NeedsAPI || t.Disruptive {
			d += " [needs the API: blocked while the cluster view is stale]"
		}
		writeWrapped(w, "    ", d)
		if t.ReplacedBy != "" {
			writeWrapped(w, "    ", "DEPRECATED (runs as "+t.ReplacedBy+"): "+t.Deprecation)
		}
		fmt.Fprintf(w, "    acts on: %s\n", remediate.ActsOn(t))
		fmt.Fprintf(w, "    runbook: %s\n", runbookAnchor("action", t.Name))
		writeParams(w, t.NewParams())
	}
	fmt.Fprintln(w, "\nPAIRS (action <- detectors whose findings can feed it; `policy check` refuses other pairs):")
	for _, t := range action.Types() {
		fmt.Fprintf(w, "  %-32s <- %s\n", t.Name, strings.Join(remediate.Feeders(t), ", "))
	}
	fmt.Fprintln(w, "\n`remediate policy show FILE` prints a policy with every default filled in.")
	return nil
}

// param is one parameter of a detector or action.
type param struct {
	name, typ, def, doc string
}

// paramsOf lists the YAML parameters of a parameter struct (pointer), with
// their defaults as set by NewParams. Nested structs are listed with
// dotted names.
func paramsOf(v any) []param {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			rv = reflect.New(rv.Type().Elem())
		}
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return nil
	}
	var out []param
	rt := rv.Type()
	for i := 0; i < rt.NumField(); i++ {
		f := rt.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || tag == "-" {
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name[:1]) + f.Name[1:]
		}
		fv := rv.Field(i)
		doc := paramDocs[path.Base(rt.PkgPath())+"."+rt.Name()+"."+f.Name]
		ft := f.Type
		if ft.Kind() == reflect.Pointer && ft.Elem().Kind() == reflect.Struct && ft.Elem().Name() != "Duration" {
			out = append(out, param{name: tag, typ: "object", def: "unset", doc: doc})
			for _, sub := range paramsOf(fv.Interface()) {
				sub.name = tag + "." + sub.name
				out = append(out, sub)
			}
			continue
		}
		out = append(out, param{name: tag, typ: typeName(ft), def: defaultOf(fv), doc: doc})
	}
	return out
}

func typeName(t reflect.Type) string {
	switch {
	case t.Name() == "Duration":
		return "duration"
	case t.Kind() == reflect.Slice:
		return "list of " + typeName(t.Elem())
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "number"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "integer"
	}
	return t.Kind().String()
}

func defaultOf(v reflect.Value) string {
	if (v.Kind() == reflect.Slice || v.Kind() == reflect.Map) && v.Len() == 0 {
		return "none"
	}
	if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct {
		// A list of records: one flow mapping each ({name: x, ...}).
		items := make([]string, 0, v.Len())
		for i := 0; i < v.Len(); i++ {
			var n yaml.Node
			if err := n.Encode(v.Index(i).Interface()); err != nil {
				return fmt.Sprint(v.Interface())
			}
			n.Style = yaml.FlowStyle
			b, err := yaml.Marshal(&n)
			if err != nil {
				return fmt.Sprint(v.Interface())
			}
			items = append(items, strings.TrimSpace(string(b)))
		}
		return strings.Join(items, "; ")
	}
	b, err := yaml.Marshal(v.Interface())
	if err != nil {
		return fmt.Sprint(v.Interface())
	}
	s := strings.TrimSpace(string(b))
	if v.Kind() == reflect.Slice {
		s = strings.Join(strings.Fields(strings.ReplaceAll(s, "- ", "")), ", ")
	}
	if s == `""` || s == "" {
		return `""`
	}
	return s
}

func writeParams(w io.Writer, params any) {
	ps := paramsOf(params)
	if len(ps) == 0 {
		fmt.Fprintln(w, "    parameters: none")
		return
	}
	fmt.Fprintln(w, "    parameters:")
	for _, p := range ps {
		fmt.Fprintf(w, "      %s (%s, default %s)\n", p.name, p.typ, p.def)
		if p.doc != "" {
			writeWrapped(w, "          ", p.doc)
		}
	}
}

// writeWrapped writes s as lines of at most ~100 columns, each prefixed by
// indent.
func writeWrapped(w io.Writer, indent, s string) {
	line := indent
	for _, word := range strings.Fields(s) {
		if len(line) > len(indent) && len(line)+1+len(word) > 100 {
			fmt.Fprintln(w, line)
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += word
	}
	if len(line) > len(indent) {
		fmt.Fprintln(w, line)
	}
}
