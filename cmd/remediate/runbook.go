package main

import "strings"

// runbookFile is the incident runbook, relative to the repository root.
const runbookFile = "examples/RUNBOOK.md"

// runbookAnchor is where examples/RUNBOOK.md explains a detector or action
// type: the anchor `<a id="detector-NAME">` or `<a id="action-NAME">`
// (NAME lower-cased) before its section. kind is "detector" or "action".
// docs/docs_test.go checks that every registered type has its anchor.
func runbookAnchor(kind, name string) string {
	return runbookFile + "#" + kind + "-" + strings.ToLower(name)
}
