package detect

import (
	"fmt"
	"slices"
	"strings"

	"github.com/remediate-dev/remediate/internal/cluster"
	"github.com/remediate-dev/remediate/internal/iptables"
	"github.com/remediate-dev/remediate/policy"
)

// The checks of the parameters several detectors take (families,
// backends, proxyMode, backend, saveTimeout, program names, agents), each
// written once: a detector's Validate calls them for its own fields.

// validateFamilies checks a families parameter: IPv4 and/or IPv6.
func validateFamilies(fams []string) []policy.FieldError {
	var errs []policy.FieldError
	if len(fams) == 0 {
		errs = append(errs, policy.FieldError{Field: "families", Msg: "must list IPv4 and/or IPv6"})
	}
	return append(errs, validateFamilyNames(fams)...)
}

// validateFamilyNames checks each of a families parameter that may be
// empty (the nftables detectors then read kube-proxy's families).
func validateFamilyNames(fams []string) []policy.FieldError {
	var errs []policy.FieldError
	for i, f := range fams {
		if f != "IPv4" && f != "IPv6" {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("families[%d]", i), Msg: fmt.Sprintf("must be IPv4 or IPv6, not %q", f)})
		}
	}
	return errs
}

// validateOneOf checks a parameter that takes one of a few words (a
// proxyMode, a backend): "must be auto, legacy or nft, not \"x\"" (the
// empty word named "empty (unknown)").
func validateOneOf(field, v string, allowed ...string) []policy.FieldError {
	if slices.Contains(allowed, v) {
		return nil
	}
	words := make([]string, len(allowed))
	for i, a := range allowed {
		words[i] = a
		if a == "" {
			words[i] = "empty (unknown)"
		}
	}
	said := words[0]
	if n := len(words); n > 1 {
		said = strings.Join(words[:n-1], ", ") + " or " + words[n-1]
	}
	return []policy.FieldError{{Field: field, Msg: fmt.Sprintf("must be %s, not %q", said, v)}}
}

// validateProxyMode checks the proxyMode parameter of the iptables
// detectors (see IPTablesRulesParams.ProxyMode): "" is unknown, and
// kernelspace (kube-proxy's Windows mode) is taken without being offered.
func validateProxyMode(m string) []policy.FieldError {
	if m == "kernelspace" {
		return nil
	}
	return validateOneOf("proxyMode", m, "auto", "iptables", "ipvs", "nftables", "")
}

// validateBackends checks a backends parameter: legacy and/or nft.
func validateBackends(bs []string) []policy.FieldError {
	var errs []policy.FieldError
	if len(bs) == 0 {
		errs = append(errs, policy.FieldError{Field: "backends", Msg: "must list legacy and/or nft"})
	}
	for i, b := range bs {
		if b != string(iptables.Legacy) && b != string(iptables.NFT) {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("backends[%d]", i), Msg: fmt.Sprintf("must be legacy or nft, not %q", b)})
		}
	}
	return errs
}

// validateSaveTimeout checks the saveTimeout parameter that bounds each
// iptables save.
func validateSaveTimeout(d policy.Duration) []policy.FieldError {
	if d.Duration <= 0 {
		return []policy.FieldError{{Field: "saveTimeout", Msg: "must be > 0"}}
	}
	return nil
}

func validateNames(field string, names []string) []policy.FieldError {
	var errs []policy.FieldError
	if len(names) == 0 {
		errs = append(errs, policy.FieldError{Field: field, Msg: "must name at least one program"})
	}
	for i, n := range names {
		if n == "" || strings.ContainsRune(n, '/') {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("%s[%d]", field, i), Msg: "must be a program name (argv[0] basename), not empty or a path"})
		}
	}
	return errs
}

func validateAgents(agents []cluster.Agent) []policy.FieldError {
	var errs []policy.FieldError
	for i, a := range agents {
		if err := a.Validate(); err != nil {
			errs = append(errs, policy.FieldError{Field: fmt.Sprintf("agents[%d]", i), Msg: err.Error()})
		}
	}
	return errs
}
