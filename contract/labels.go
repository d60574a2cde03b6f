package contract

// The label and annotation exit-guard puts on the suspect pods it admits in warn and dry-run
// mode. `kubectl get pods -A -l exit-guard.io/suspect` lists them.
const (
	LabelSuspect            = "exit-guard.io/suspect"
	AnnotationSuspectReason = "exit-guard.io/suspect-reason"
)
