// Package contract is what exit-guard promises to the programs that read it: the reason codes
// of its decisions (in metrics, logs, audit annotations, and a refusal's Status.details.causes),
// the reasons of the Events it records on a workflow, the label and annotation it puts on the
// suspect pods it admits in warn and dry-run mode, and RefusalReason, which reads a refusal's
// code back from an API error. It imports nothing of the guard, so that any package, the
// guard's own and a client's, can depend on it.
package contract
