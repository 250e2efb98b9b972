package probe

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/remediate-dev/remediate/internal/finding"
)

// Ref is the typed reference of a Service path probe finding
// (finding.KindServicePath): one TCP port of one Service in one IP family,
// target "service-path/IPv4/default/kubernetes:443".
type Ref struct {
	// Family is "IPv4" or "IPv6".
	Family    string
	Namespace string
	Name      string
	// Port is the Service port (not the endpoints' target port).
	Port int32
}

// Kind is finding.KindServicePath.
func (Ref) Kind() finding.Kind { return finding.KindServicePath }

// Service is "namespace/name".
func (r Ref) Service() string { return r.Namespace + "/" + r.Name }

// Target encodes the reference as a finding target.
func (r Ref) Target() string {
	return fmt.Sprintf("service-path/%s/%s/%s:%d", r.Family, r.Namespace, r.Name, r.Port)
}

// ParseRef decodes a target written by Target.
func ParseRef(target string) (Ref, error) {
	rest, ok := strings.CutPrefix(target, "service-path/")
	if !ok {
		return Ref{}, fmt.Errorf("target %q is not a service-path target", target)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return Ref{}, fmt.Errorf("target %q: want service-path/FAMILY/NAMESPACE/NAME:PORT", target)
	}
	name, port, ok := strings.Cut(parts[2], ":")
	if !ok {
		return Ref{}, fmt.Errorf("target %q has no port", target)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return Ref{}, fmt.Errorf("target %q: bad port %q", target, port)
	}
	r := Ref{Family: parts[0], Namespace: parts[1], Name: name, Port: int32(p)}
	if (r.Family != "IPv4" && r.Family != "IPv6") || r.Namespace == "" || r.Name == "" {
		return Ref{}, fmt.Errorf("target %q: bad family, namespace or name", target)
	}
	return r, nil
}
