package policy

// FieldError is a validation problem in a detector's or action's parameters.
// Field is the path relative to the parameter block ("factor", "names[2]");
// the loader turns it into file:line:col and the full rule path.
type FieldError struct {
	Field string
	Msg   string
}

// Validator is implemented by parameter structs that check their own values.
// Validate is called after defaults and YAML values have been applied.
type Validator interface {
	Validate() []FieldError
}

// Catalog tells the policy loader which detector and action types exist and
// what parameters each takes. New*Params returns a fresh pointer to the
// type's parameter struct with its defaults filled in, or false when the type
// is unknown. Parameter structs use `yaml:"name"` tags; any key without a
// matching field is an error.
type Catalog interface {
	NewDetectorParams(typ string) (any, bool)
	NewActionParams(typ string) (any, bool)
	DetectorTypes() []string
	ActionTypes() []string
}

// PairChecker is implemented by catalogs that know which detector types can
// feed which action types. CheckPair returns "" when findings of detector
// type det can feed action type act, else why not (naming the detectors
// that can); the loader reports it at the rule's action type. Only called
// for types the catalog knows.
type PairChecker interface {
	CheckPair(det, act string) string
}

// Deprecator is implemented by catalogs that keep old type names working.
// DeprecatedAction returns what to say about action type typ when it is
// such an old name (the loader accepts it and puts the note in
// Policy.Notes), "" otherwise.
type Deprecator interface {
	DeprecatedAction(typ string) string
}
