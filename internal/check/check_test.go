package check

import (
	"errors"
	"testing"
)

// TestCallFailedIsTheGuardsWebhookOnly: a failed call of another webhook (a policy engine that
// is down, with failurePolicy Fail) is not the guard's, and the check does not wait for it.
func TestCallFailedIsTheGuardsWebhookOnly(t *testing.T) {
	for msg, want := range map[string]bool{
		`Internal error occurred: failed calling webhook "validate.exit-guard.io": failed to call webhook: connection refused`:      true,
		`Internal error occurred: failed calling webhook "mutate.exit-guard.io": failed to call webhook: context deadline exceeded`: true,
		`Internal error occurred: failed calling webhook "validate.kyverno.svc-fail": failed to call webhook: connection refused`:   false,
		`admission webhook "validate.exit-guard.io" denied the request: workflow-deleted`:                                           false,
	} {
		if got := callFailed(errors.New(msg)); got != want {
			t.Errorf("callFailed(%q) = %v, want %v", msg, got, want)
		}
	}
}
