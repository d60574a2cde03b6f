// Package webhook is exit-guard's admission webhook. It refuses what a stale copy of a
// completed Argo Workflow tries to send, after making sure with a live read of the workflow,
// and lets everything else through at once: the pods it sends again (exit handlers, lifecycle
// hooks and steps, every one of them by default; --cover narrows it), its agent pods, its
// WorkflowTaskSet writes, which run HTTP and plugin exit handlers, and the WorkflowFailed
// Event that says a workflow that Succeeded failed.
//
// Every kind of object goes through one pipeline (pipeline.go): http.go reads the request and
// decode.go its review; the reader of its kind turns the request into facts (pod.go,
// taskset.go, event.go; the vocabulary in facts.go); the decision (decide.go, with the live
// read of liveread.go on the client of liveclient.go, in the slots of slots.go) is the table
// of docs/decisions.md and names its row; the mode is applied once (answer.go); the decision is
// audited (audit.go, metrics.go, overturned.go). What Argo release made the pods it judges is
// read from their executor image and said, never decided on (argoversion.go).
//
// A kind owns its rules (kind.go): its kindSpec holds its paths and reader, its roles (which
// are decided store-first, which read within the hook-and-step budget), its rows that answer
// from the request alone, the hooks of its own rows before and after the shared read
// (taskset_rows.go: T5 to T7, with taskset_creates.go and repeats.go; event_rows.go: E4 to
// E12), and its words where they differ from the shared ones. Setup, the pipeline, the
// decision and the metrics loop over kinds and name no kind or role: a new kind adds its files
// and its entry in kinds (docs/development.md). The reason codes, Event reasons and labels that
// other programs read are in package contract.
//
// Setup (setup.go, with options.go) registers each kind's paths on the manager's webhook
// server: ValidatePath decides pods (refuses in enforce mode), MutatePath marks suspect pods in
// warn and dry-run mode, ValidateTaskSetPath decides WorkflowTaskSet writes and
// ValidateEventPath Events, in every mode. Register the pod path of the mode with the API
// server, and the others: config/webhook, generated from each kind's marker, has them all.
package webhook
