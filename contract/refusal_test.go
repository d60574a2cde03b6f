package contract

import (
	"errors"
	"net/http"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Only the guard's refusal reads back as one: errors from elsewhere, of the same code or with
// the same cause on another code, do not. (The guard's own refusals read back in the webhook's
// TestRefusalCarriesItsReasonCode.)
func TestRefusalReasonReadsOnlyTheGuardsRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"no error", nil},
		{"another error", errors.New("connection refused")},
		{"a Forbidden from elsewhere", apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "p", errors.New("RBAC"))},
		{"a 429 from elsewhere", apierrors.NewTooManyRequests("the server is busy", 1)},
		{"a 409 with the guard's cause", &apierrors.StatusError{ErrStatus: metav1.Status{Code: http.StatusConflict, Reason: metav1.StatusReasonConflict,
			Details: &metav1.StatusDetails{Causes: []metav1.StatusCause{{Type: metav1.CauseType(ReasonWorkflowDeleted), Field: CauseField}}}}}},
	} {
		t.Run("not a refusal: "+tc.name, func(t *testing.T) {
			if got, ok := RefusalReason(tc.err); ok {
				t.Errorf("RefusalReason(%v) = %q, want none", tc.err, got)
			}
		})
	}
}
