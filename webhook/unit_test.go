//go:build !envtest

package webhook

import (
	"os"
	"testing"
)

// TestMain of the unit tier (make test-unit): the tests of this package that need no API
// server. make test builds with the envtest tag, whose TestMain (main_test.go) starts one and
// runs these too.
func TestMain(m *testing.M) {
	useGuardLog()
	os.Exit(m.Run())
}
