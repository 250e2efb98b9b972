package policy

import (
	"fmt"
	"time"

	"gopkg.in/yaml.v3"
)

// Duration is a time.Duration written in YAML as a Go duration string ("30s",
// "5m", "1h30m"). A bare 0 is accepted as zero.
type Duration struct{ time.Duration }

// D is a shorthand for constructing a Duration.
func D(d time.Duration) Duration { return Duration{d} }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("must be a duration such as \"30s\"")
	}
	if n.Value == "0" {
		d.Duration = 0
		return nil
	}
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("invalid duration %q (use e.g. \"30s\", \"5m\")", n.Value)
	}
	d.Duration = v
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return d.Duration.String(), nil }

// MarshalJSON renders the duration as its string form.
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.Duration.String() + `"`), nil }
