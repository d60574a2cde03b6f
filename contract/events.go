package contract

// Reasons of the Events the guard records on a workflow: stable, for alerting and
// `kubectl get events --field-selector`.
const (
	// EventReasonDenied: a pod or TaskSet write of the workflow was refused (enforce mode).
	EventReasonDenied = "ExitHandlerDenied"
	// EventReasonWarned: an object of the workflow would have been refused (warn mode).
	EventReasonWarned = "ExitHandlerWouldBeDenied"
	// EventReasonUnexpectedRequester: an object of the workflow was refused (or would have
	// been) on behalf of someone other than the expected workflow controller (Normal: without
	// --webhook-client-ca-file anyone who reaches the webhook port can name any requester).
	EventReasonUnexpectedRequester = "RefusedForUnexpectedRequester"
	// EventReasonTaskSetOwnerGone: an update of a WorkflowTaskSet that still belongs to a
	// deleted workflow of this name was refused (Normal: perhaps this workflow's own write,
	// which waits for the garbage collector; not a stale exit handler).
	EventReasonTaskSetOwnerGone = "TaskSetOwnerGone"
	// EventReasonFailureEventDenied and EventReasonFailureEventWarned: a WorkflowFailed Event
	// of a workflow that Succeeded was refused, or would have been in warn mode (Normal: what
	// they report is a false alarm stopped).
	EventReasonFailureEventDenied = "FailureEventDenied"
	EventReasonFailureEventWarned = "FailureEventWouldBeDenied"
)

// EventReasonRefusalOverturned is the reason of the Event recorded when the guard refused a
// write of the workflow from its store alone (its live read had failed), and has since seen the
// workflow running, written before the refusal: the refusal was probably wrong. A refused pod
// or TaskSet write waited until Argo's controller tried again; a refused Event was lost
// (Warning: someone should know).
const EventReasonRefusalOverturned = "RefusalOverturned"

// EventReasonRepeatAfterReuse is the reason of the Event recorded on a workflow when the guard
// learns that, after this workflow took its name, it admitted without a read (row T7) a TaskSet
// create that named the deleted workflow of that name: the one case row T7 leaves (docs/
// decisions.md), in which this workflow's agent may run the deleted workflow's task (Warning).
const EventReasonRepeatAfterReuse = "RepeatAdmittedAfterReuse"
