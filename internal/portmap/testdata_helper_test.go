package portmap

import "os"

// testdataString reads a fixture file shared by tests (a missing file is
// a broken checkout: the test binary stops at once).
func testdataString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return string(b)
}
