package contract

// Reason is the stable code of a decision: in metrics, logs and audit annotations, and, for a
// refusal, in the Status.details.causes of the answer (RefusalReason reads it back). Each
// names one or more rows of docs/decisions.md.
type Reason string

// Reasons to admit.
const (
	ReasonNotOwnedByWorkflow         Reason = "not-owned-by-workflow"
	ReasonArtifactGCOrOtherComponent Reason = "artifact-gc-or-other-component"
	ReasonNamespaceNotWatched        Reason = "namespace-not-watched"
	ReasonNotCoveredByPolicy         Reason = "not-covered-by-policy"
	ReasonNoNewTask                  Reason = "no-new-task"
	// ReasonNotAFailureClaim: an Event about a workflow that does not say it failed.
	ReasonNotAFailureClaim Reason = "not-a-failure-claim"
	// ReasonClaimMatchesPhase: an Event that says the workflow failed, which it did (Failed or
	// Error). A stale duplicate of a real failure's Event cannot be told from the real one.
	ReasonClaimMatchesPhase Reason = "claim-matches-phase"
	// ReasonWorkflowGone: an Event that says the workflow failed, whose workflow no longer
	// exists and was not seen succeeding: a real failure's Event may land after its workflow
	// was deleted (a TTL), so only a tombstone whose last phase was Succeeded refuses.
	ReasonWorkflowGone        Reason = "workflow-gone"
	ReasonWorkflowNotTerminal Reason = "workflow-not-terminal"
	ReasonPhaseNotDenied      Reason = "phase-not-denied"
	ReasonNotSeenCompleted    Reason = "not-seen-completed"
	// ReasonUnverifiedFailOpen: no live read answered, and the store knows nothing of the
	// workflow, or not its phase.
	ReasonUnverifiedFailOpen Reason = "unverified-fail-open"
	// ReasonUnconfirmedCompletion: the store says completed, no live read answered, and the
	// store fallback lets only tombstones refuse.
	ReasonUnconfirmedCompletion Reason = "unconfirmed-completion"
	// ReasonTasksOfNameHolder: an update of a WorkflowTaskSet whose owner was deleted, every
	// task it adds a pending HTTP or plugin node of the running workflow that now holds the
	// name (read live): that workflow's own write after AlreadyExists (row T6).
	ReasonTasksOfNameHolder Reason = "tasks-of-name-holder"
	// ReasonRepeatsAdmittedCreate: a WorkflowTaskSet create that repeats, task for task and
	// template for template, one this replica admitted for the same workflow (by UID) after a
	// live read found it running, seconds before, the store still holding it running (row
	// T7): Argo sends it on every pass while an HTTP or plugin node is pending, and it fails
	// with AlreadyExists; the patch after it is judged.
	ReasonRepeatsAdmittedCreate Reason = "repeats-admitted-create"
)

// Reasons to refuse.
const (
	ReasonWorkflowCompleted Reason = "workflow-completed"
	ReasonWorkflowDeleted   Reason = "workflow-deleted"
	ReasonWorkflowReplaced  Reason = "workflow-replaced"
	// ReasonWorkflowSucceeded refuses an Event that says the workflow failed, when the
	// workflow, by UID, Succeeded.
	ReasonWorkflowSucceeded Reason = "workflow-succeeded"
	// ReasonTaskSetOwnerGone refuses an update of a WorkflowTaskSet whose owner was deleted
	// (another workflow now holds its name, or the store keeps a tombstone and no live read
	// answered), unless row T6 admits it. The agent of the workflow that holds the name runs
	// every task of the TaskSet named like it, so a stale copy's write must not land; a new
	// workflow's own write (Argo patches on AlreadyExists, and the patched object keeps the
	// old owner) is refused only while its nodes are not yet written to its status, and comes
	// again on its next pass. Not a stale exit handler: counted apart, never alerted as one.
	ReasonTaskSetOwnerGone Reason = "taskset-owner-gone"
)

// RefusalReasons are the reasons a refusal carries.
var RefusalReasons = []Reason{ReasonWorkflowCompleted, ReasonWorkflowDeleted, ReasonWorkflowReplaced, ReasonWorkflowSucceeded, ReasonTaskSetOwnerGone}
