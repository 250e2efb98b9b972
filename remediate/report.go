package remediate

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/remediate-dev/remediate/internal/causes"
	"github.com/remediate-dev/remediate/internal/finding"
	"github.com/remediate-dev/remediate/internal/termsafe"
)

// Outcome of a decision. These strings are part of the stable JSON report.
type Outcome string

// Outcomes.
const (
	OutcomeExecuted Outcome = "executed"
	OutcomeDryRun   Outcome = "dry-run"
	OutcomeBlocked  Outcome = "blocked"
	OutcomeFailed   Outcome = "failed"
	OutcomeSkipped  Outcome = "skipped"
)

// ReportFinding is a finding with the rule that produced it.
type ReportFinding struct {
	Rule string `json:"rule"`
	finding.Finding
}

// Decision is what the engine decided for one (rule, target) this cycle.
type Decision struct {
	Rule    string  `json:"rule"`
	Action  string  `json:"action"`
	Target  string  `json:"target"`
	Outcome Outcome `json:"outcome"`
	Reason  string  `json:"reason"`
	// Phase is the target's state machine phase after the decision.
	Phase Phase `json:"phase,omitempty"`
	// Guardrail names the guardrail that blocked, if any.
	Guardrail string `json:"guardrail,omitempty"`
}

// SkippedCheck is a rule whose detector could not run here, and why.
type SkippedCheck struct {
	Rule     string `json:"rule"`
	Detector string `json:"detector"`
	Reason   string `json:"reason"`
}

// Report is the result of one cycle. Its JSON keys are stable: scripts
// depend on node, mode, findings[] and decisions[].
type Report struct {
	Node string `json:"node"`
	// Mode is the effective mode: "audit" or "enforce".
	Mode string `json:"mode"`
	// ForcedDryRun is true when --dry-run forced audit mode.
	ForcedDryRun bool            `json:"forcedDryRun,omitempty"`
	Time         time.Time       `json:"time"`
	Findings     []ReportFinding `json:"findings"`
	Decisions    []Decision      `json:"decisions"`
	Skipped      []SkippedCheck  `json:"skipped"`
	// OK lists the rules whose detector ran and found nothing, with what
	// it judged: with Findings and Skipped, every rule appears once.
	OK []OKCheck `json:"ok"`
	// Sampled says how rate and window checks were sampled by a one-shot
	// run (remediate --once --sample); absent when they were not.
	Sampled *SampleInfo `json:"sampled,omitempty"`
	// Warnings are problems of the daemon itself that are not findings
	// (a quarantined state file, a journal write error).
	Warnings []string `json:"warnings,omitempty"`
}

// SampleInfo is how a one-shot run sampled the checks that judge across
// samples: a first sample of Rules, then this report Seconds later.
type SampleInfo struct {
	Seconds float64  `json:"seconds"`
	Rules   []string `json:"rules"`
	// Capped are the rules whose sample count was capped to the two
	// samples taken (detect.SampleCounted).
	Capped []string `json:"capped,omitempty"`
}

// ExitCode is the --once exit status: 2 when findings are present
// (whatever was decided), 0 otherwise.
func (r *Report) ExitCode() int {
	if len(r.Findings) > 0 {
		return 2
	}
	return 0
}

// WriteJSON writes the report as indented JSON (runes a terminal would act
// on escaped as \uXXXX: the same JSON value, safe to print).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(&termsafe.JSONWriter{W: w})
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as readable tables, like kubectl. Findings
// carry outside text (a process's argv, kube-proxy's answers): the whole
// report goes through termsafe, and every free-text cell is put on one
// line, so nothing in it drives the terminal or forges a line.
func (r *Report) WriteText(w io.Writer) error {
	w = termsafe.NewWriter(w)
	mode := r.Mode
	if r.ForcedDryRun {
		mode += " (--dry-run)"
	}
	fmt.Fprintf(w, "Node: %s   Mode: %s   Time: %s\n", r.Node, mode, r.Time.UTC().Format(time.RFC3339))
	if s := r.Sampled; s != nil {
		fmt.Fprintf(w, "Sampled: %d rate/window checks twice, %s apart (%s)\n", len(s.Rules),
			time.Duration(s.Seconds*float64(time.Second)).Round(time.Second), strings.Join(s.Rules, ", "))
		if len(s.Capped) > 0 {
			fmt.Fprintf(w, "Sample counts capped to the 2 samples taken: %s\n", strings.Join(s.Capped, ", "))
		}
	}
	for _, warn := range r.Warnings {
		fmt.Fprintf(w, "WARNING: %s\n", warn)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(r.Findings) == 0 {
		fmt.Fprintln(w, "FINDINGS: none")
	} else {
		fmt.Fprintln(w, "FINDINGS:")
		fmt.Fprintln(tw, "SEVERITY\tRULE\tDETECTOR\tTARGET\tMESSAGE")
		for _, f := range r.Findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Severity, f.Rule, f.Detector, oneLine(f.Target), oneLine(f.Message))
		}
		tw.Flush()
		writeTopCauses(w, r.Findings)
	}
	fmt.Fprintln(w)
	if len(r.Decisions) == 0 {
		fmt.Fprintln(w, "DECISIONS: none")
	} else {
		fmt.Fprintln(w, "DECISIONS:")
		fmt.Fprintln(tw, "OUTCOME\tRULE\tACTION\tTARGET\tREASON")
		for _, d := range r.Decisions {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", d.Outcome, d.Rule, orDash(d.Action), oneLine(d.Target), oneLine(d.Reason))
		}
		tw.Flush()
	}
	ok := make([][3]string, len(r.OK))
	for i, c := range r.OK {
		ok[i] = [3]string{c.Rule, c.Detector, c.Judged}
	}
	checkTable(w, "CHECKS OK:", "JUDGED", ok)
	skipped := make([][3]string, len(r.Skipped))
	for i, s := range r.Skipped {
		skipped[i] = [3]string{s.Rule, s.Detector, s.Reason}
	}
	checkTable(w, "SKIPPED CHECKS:", "REASON", skipped)
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%d checks: %d with findings, %d ok, %d skipped. Evidence and full detail: -o json.\n",
		len(r.OK)+len(r.Skipped)+r.rulesWithFindings(), r.rulesWithFindings(), len(r.OK), len(r.Skipped))
	return nil
}

// writeTopCauses writes, for each finding that carries likely causes, its
// top one in one line (the ranked list with figures is in -o json).
func writeTopCauses(w io.Writer, fs []ReportFinding) {
	first := true
	for _, f := range fs {
		top, err := finding.EvidenceString(f.Evidence, causes.EvidenceTop)
		if err != nil {
			continue
		}
		if first {
			fmt.Fprintln(w, "LIKELY CAUSE (top of each finding's ranked list; all with figures: -o json):")
			first = false
		}
		fmt.Fprintf(w, "  %s %s: %s\n", f.Rule, oneLine(f.Target), oneLine(top))
	}
}

// checkTable writes a titled RULE/DETECTOR/<what> table, if it has rows.
func checkTable(w io.Writer, title, what string, rows [][3]string) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n%s\n", title)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "RULE\tDETECTOR\t%s\n", what)
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", r[0], r[1], oneLine(r[2]))
	}
	tw.Flush()
}

// rulesWithFindings counts the rules with at least one finding.
func (r *Report) rulesWithFindings() int {
	seen := map[string]bool{}
	for _, f := range r.Findings {
		seen[f.Rule] = true
	}
	return len(seen)
}

// maxTextField bounds one field of the text report (a hostile or runaway
// message); the full text is in -o json.
const maxTextField = 2000

// oneLine puts s on one line, whole: causes are at the end of messages, so
// cutting them short loses what matters. Controls left after the
// whitespace is folded are escaped (termsafe.Line).
func oneLine(s string) string {
	s = termsafe.Line(strings.Join(strings.Fields(s), " "))
	if len(s) > maxTextField {
		s = s[:maxTextField-len(" ... (cut; see -o json)")] + " ... (cut; see -o json)"
	}
	return s
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// sortReport orders findings and decisions deterministically.
func sortReport(r *Report) {
	sort.SliceStable(r.Findings, func(i, j int) bool {
		a, b := r.Findings[i], r.Findings[j]
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Target < b.Target
	})
	sort.SliceStable(r.Decisions, func(i, j int) bool {
		a, b := r.Decisions[i], r.Decisions[j]
		if a.Rule != b.Rule {
			return a.Rule < b.Rule
		}
		return a.Target < b.Target
	})
	sort.SliceStable(r.Skipped, func(i, j int) bool { return r.Skipped[i].Rule < r.Skipped[j].Rule })
	sort.SliceStable(r.OK, func(i, j int) bool { return r.OK[i].Rule < r.OK[j].Rule })
}
