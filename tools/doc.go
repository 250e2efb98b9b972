// Package tools holds the repository's helper programs (tools/sbom, the
// control plane and helm builds, the VM lane, the host packages) and the
// tests of the scripts `make test` runs: tools/progress.sh (progress of
// the long builds) and tools/testlanes.sh (the lanes a run skips, and why).
package tools
