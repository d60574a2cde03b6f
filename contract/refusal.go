package contract

import (
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// CauseField is the field of the object a refusal's cause points at: where the object names
// its workflow. A refusal carries one cause, of type its Reason and of this field.
const CauseField = "metadata.ownerReferences"

// RefusalReason returns the reason code of exit-guard's refusal in err, an error from the API
// server (a create or update that the guard refused), and whether err is such a refusal.
// Programs match the code; the message is for people. A refusal is a 429 (TooManyRequests); a
// 403 with the guard's cause is one too, as the guard answered before, so that a client reads
// both sides of a rolling upgrade.
func RefusalReason(err error) (Reason, bool) {
	var status apierrors.APIStatus
	if !apierrors.IsTooManyRequests(err) && !apierrors.IsForbidden(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return "", false
	}
	for _, c := range status.Status().Details.Causes {
		for _, r := range RefusalReasons {
			if c.Type == metav1.CauseType(r) && c.Field == CauseField {
				return r, true
			}
		}
	}
	return "", false
}

// IsRefusal says whether err, an error from the API server, is a refusal by exit-guard.
func IsRefusal(err error) bool {
	_, ok := RefusalReason(err)
	return ok
}
