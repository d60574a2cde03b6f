// Package webhook is exit-guard's admission webhook. It refuses what a stale copy of a
// completed Argo Workflow tries to send, after making sure with a live read of the workflow,
// and lets everything else through at once: the pods of its exit handlers (and, by policy,
// hooks and steps), its agent pods, and its WorkflowTaskSet writes, which run HTTP and plugin
// exit handlers.
//
// Every kind of object goes through one pipeline (handle.go): its reader turns the request into
// facts (pod.go, taskset.go), the decision (decide.go, with the live read of liveread.go) is
// the table of docs/decisions.md and names its row, the mode is applied once (answer.go), and
// the decision is audited (audit.go, metrics.go). A new kind adds a reader and rows.
//
// Setup (setup.go) registers three paths on the manager's webhook server: ValidatePath
// decides pods (deny in enforce mode), MutatePath marks suspect pods in warn and dry-run
// mode, ValidateTaskSetPath decides WorkflowTaskSet writes in every mode. Register the pod
// path of the mode with the API server, and the TaskSet path.
package webhook
