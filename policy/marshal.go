package policy

import (
	"fmt"

	"gopkg.in/yaml.v3"
)

// MarshalYAML writes a component as `type` followed by its parameters.
func (c Component) MarshalYAML() (any, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	n.Content = append(n.Content,
		&yaml.Node{Kind: yaml.ScalarNode, Value: "type"},
		&yaml.Node{Kind: yaml.ScalarNode, Value: c.Type})
	if c.Params == nil {
		return n, nil
	}
	var pn yaml.Node
	if err := pn.Encode(c.Params); err != nil {
		return nil, fmt.Errorf("encoding %s parameters: %w", c.Type, err)
	}
	if pn.Kind == yaml.MappingNode {
		n.Content = append(n.Content, pn.Content...)
	}
	return n, nil
}

// Marshal renders the effective policy (defaults included) as YAML.
func Marshal(p *Policy) ([]byte, error) {
	return yaml.Marshal(p)
}
