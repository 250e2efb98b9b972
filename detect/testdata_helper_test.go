package detect

import (
	"os"
	"sync"
)

// testdataString reads a fixture file shared by tests (a missing file is
// a broken checkout: the test binary stops at once).
func testdataString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// testdataOnce reads a fixture of another package's testdata when a test
// first asks for it, not when the test binary starts: the VM lane runs
// this package's binary with its own testdata only.
func testdataOnce(path string) func() string {
	return sync.OnceValue(func() string { return testdataString(path) })
}
