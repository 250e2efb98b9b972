package dataplane

import (
	"net/netip"
	"sort"
)

// Problem is one kind of difference between programmed and desired state.
type Problem string

// Problems.
const (
	// MissingEntry: the desired entry is not programmed at all (a Service
	// created after kube-proxy stopped hearing the API).
	MissingEntry Problem = "missing-entry"
	// MissingBackends: the entry forwards, but not to every endpoint it
	// should (new pods never programmed; with topology hints: to none of
	// them).
	MissingBackends Problem = "missing-backends"
	// StaleBackends: the entry forwards to addresses that are not usable
	// endpoints any more (deleted or unready pods).
	StaleBackends Problem = "stale-backends"
	// WrongVerdict: forward where kube-proxy would reject or drop, or the
	// other way round.
	WrongVerdict Problem = "wrong-verdict"
	// StaleEntry: programmed for a Service port that the cluster view does
	// not have (deleted Service, removed port or external IP).
	StaleEntry Problem = "stale-entry"
)

// Diff is one entry whose programmed state differs from the desired one.
type Diff struct {
	Port    PortName
	Kind    Kind
	Key     EntryKey
	Problem Problem
	// Want and Got are the verdicts ("" when absent).
	Want, Got Verdict
	// Missing are desired backends not programmed; Stale programmed
	// backends not desired.
	Missing, Stale []netip.AddrPort
}

// Compare returns the differences between what is programmed and what is
// desired for one family, sorted by port and entry. noVerdicts says the
// programmed source cannot express reject or drop (IPVS: a Service without
// endpoints is a virtual server without real servers), so a desired
// reject or drop matches a programmed entry forwarding to nobody.
func Compare(got *State, want *Desired, noVerdicts bool) []Diff {
	var out []Diff
	matched := 0 // programmed entries that a desired entry matched
	// Entries are matched by key within the same Service port; an entry
	// key found under another port name (a renamed port) is stale there
	// and missing here.
	for name, dp := range want.Ports {
		gp := got.Ports[name]
		for _, we := range dp.Entries {
			var ge *Entry
			if gp != nil {
				ge = gp.Entry(we.Key)
			}
			d := Diff{Port: dp.Name, Kind: we.Kind, Key: we.Key, Want: we.Verdict}
			if ge == nil {
				if we.Verdict != Forward && noVerdicts {
					continue
				}
				d.Problem, d.Missing = MissingEntry, we.Backends
				out = append(out, d)
				continue
			}
			matched++
			d.Got = ge.Verdict
			gv := ge.Verdict
			if noVerdicts && gv == Forward && len(ge.Backends) == 0 && we.Verdict != Forward {
				gv = we.Verdict
			}
			switch {
			case we.Verdict == Forward && gv == Forward:
				d.Missing, d.Stale = minus(we.Backends, ge.Backends), minus(ge.Backends, we.Backends)
				if dp.Subset && len(d.Missing) < len(we.Backends) {
					d.Missing = nil // a topology subset: some desired backend is there
				}
				switch {
				case len(d.Missing) > 0:
					d.Problem = MissingBackends
				case len(d.Stale) > 0:
					d.Problem = StaleBackends
				default:
					continue
				}
			case we.Verdict != Forward && gv == Forward && len(ge.Backends) > 0:
				d.Problem, d.Stale = StaleBackends, ge.Backends
			case we.Verdict != gv:
				d.Problem = WrongVerdict
			default:
				continue
			}
			out = append(out, d)
		}
	}
	programmed := 0
	for _, sp := range got.Ports {
		programmed += len(sp.Entries)
	}
	for name, sp := range got.Ports {
		if matched == programmed {
			break // every programmed entry is a desired one: nothing stale
		}
		dp := want.Ports[name]
		for _, e := range sp.Entries {
			if dp != nil && dp.Entry(e.Key) != nil {
				continue
			}
			out = append(out, Diff{Port: sp.Name, Kind: e.Kind, Key: e.Key, Problem: StaleEntry, Got: e.Verdict, Stale: e.Backends})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Port != out[j].Port {
			return out[i].Port.String() < out[j].Port.String()
		}
		return lessKey(out[i].Key, out[j].Key)
	})
	return out
}

// minus returns the elements of a (sorted) not in b (sorted).
func minus(a, b []netip.AddrPort) []netip.AddrPort {
	var out []netip.AddrPort
	j := 0
	for _, x := range a {
		for j < len(b) && b[j].Compare(x) < 0 {
			j++
		}
		if j < len(b) && b[j] == x {
			continue
		}
		out = append(out, x)
	}
	return out
}
