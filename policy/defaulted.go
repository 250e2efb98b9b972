package policy

import (
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// defaultNote returns "(not set: its default is V)" for the field of
// struct v whose YAML name is field, so that an error about a value the
// file did not write names the default it is about. ok is false when field
// is not a plain field name of v (a path into a list, an unknown name).
func defaultNote(v reflect.Value, field string) (string, bool) {
	if v.Kind() != reflect.Struct || strings.ContainsAny(field, ".[") {
		return "", false
	}
	for _, fi := range structFields(v.Type()) {
		if fi.name != field {
			continue
		}
		b, err := yaml.Marshal(v.FieldByIndex(fi.index).Interface())
		if err != nil {
			return "", false
		}
		s := strings.TrimSpace(string(b))
		if strings.Contains(s, "\n") {
			s = "[" + strings.Join(strings.Fields(strings.ReplaceAll(s, "- ", "")), ", ") + "]"
		}
		return "(not set: its default is " + s + ")", true
	}
	return "", false
}
