package deploy

import (
	"os"
	"testing"
)

// TestPrint writes an overlay's YAML when REMEDIATE_PRINT=<overlay>; a
// helper for humans (`REMEDIATE_PRINT=audit go test -run TestPrint ./deploy`).
func TestPrint(t *testing.T) {
	o := os.Getenv("REMEDIATE_PRINT")
	if o == "" {
		t.Skip("set REMEDIATE_PRINT=audit|enforce to print an overlay")
	}
	m, err := Render(o)
	if err != nil {
		t.Fatal(err)
	}
	y, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	_, _ = os.Stdout.Write(y)
}
