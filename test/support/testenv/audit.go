package testenv

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// ControllerUser is the user Argo's workflow controller acts as in the tests that census its
// writes: a name of its own, so that the API server's audit log tells its writes from the
// test's (the ServiceAccount form the chart's guard.expectedRequester takes).
const ControllerUser = "system:serviceaccount:argo:argo-workflow-controller"

// SecondControllerUser is the user a second controller acts as, where a test runs two at once
// (argo-workflows #16034), so that the audit log tells its writes from the first one's.
const SecondControllerUser = "system:serviceaccount:argo:argo-workflow-controller-second"

// writeVerbs are the verbs of the requests that change something.
var writeVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

// AuditWrites writes into dir an audit policy that records, at the Metadata level, every write
// (create, update, patch, delete, deletecollection) that users make, and nothing else, and
// returns the kube-apiserver flags that apply it (Options.APIServerFlags) and the path of the
// JSON log they write.
func AuditWrites(dir string, users ...string) (flags map[string]string, log string, err error) {
	rule := map[string]any{"level": "Metadata", "users": users, "verbs": writeVerbs}
	// A WorkflowTaskSet write's body too (Write.Request): whether it hands Argo's agent a task
	// or only removes completed ones.
	taskSets := map[string]any{"level": "Request", "users": users, "verbs": writeVerbs,
		"resources": []any{map[string]any{"group": "argoproj.io", "resources": []string{"workflowtasksets"}}}}
	policy := map[string]any{
		"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
		// One event a request, once its answer is known.
		"omitStages": []string{"RequestReceived", "ResponseStarted", "Panic"},
		"rules":      []any{taskSets, rule, map[string]any{"level": "None"}},
	}
	raw, err := json.Marshal(policy) // JSON is YAML
	if err != nil {
		return nil, "", err
	}
	policyFile, log := filepath.Join(dir, "audit-policy.yaml"), filepath.Join(dir, "audit.log")
	if err := os.WriteFile(policyFile, raw, 0o600); err != nil {
		return nil, "", err
	}
	return map[string]string{
		"audit-policy-file": policyFile,
		"audit-log-path":    log,
		"audit-log-format":  "json",
		// Each event is written before the answer goes out: a test reads the log as soon as
		// its request has returned.
		"audit-log-mode": "blocking",
	}, log, nil
}

// Write is one write the audit log recorded.
type Write struct {
	At                    time.Time
	User                  string
	Verb                  string
	Resource, Subresource string
	Namespace, Name       string
	// Code is the HTTP status of the answer: 2xx the write landed, 4xx it was refused (a 429
	// may be the guard's), 409 a conflict.
	Code int
	// Annotations are the audit annotations of the request: admission webhooks' among them,
	// under <webhook name>/<key> (the guard's pod-kind, decision, reason).
	Annotations map[string]string
	// Request is the request's body, for WorkflowTaskSet writes (a patch, or the object).
	Request json.RawMessage
}

// String is the write as a census row names it: "create pods 201", "patch workflows/status 200".
func (w Write) String() string {
	r := w.Resource
	if w.Subresource != "" {
		r += "/" + w.Subresource
	}
	return fmt.Sprintf("%s %s %d", w.Verb, r, w.Code)
}

// auditEvent is the part of an audit.k8s.io/v1 Event that ReadWrites reads.
type auditEvent struct {
	Stage string `json:"stage"`
	Verb  string `json:"verb"`
	User  struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceived time.Time         `json:"requestReceivedTimestamp"`
	Annotations     map[string]string `json:"annotations"`
	RequestObject   json.RawMessage   `json:"requestObject"`
}

// ReadWrites reads the writes of the audit log at path (AuditWrites), in the order they were
// logged.
func ReadWrites(path string) ([]Write, error) {
	f, err := os.Open(path) //nolint:gosec // G304: the log of the test's own API server
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []Write
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var e auditEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if e.Stage != "ResponseComplete" || e.ObjectRef == nil {
			continue
		}
		w := Write{At: e.RequestReceived, User: e.User.Username, Verb: e.Verb, Resource: e.ObjectRef.Resource,
			Subresource: e.ObjectRef.Subresource, Namespace: e.ObjectRef.Namespace, Name: e.ObjectRef.Name, Annotations: e.Annotations,
			Request: e.RequestObject}
		if e.ResponseStatus != nil {
			w.Code = e.ResponseStatus.Code
		}
		out = append(out, w)
	}
	return out, sc.Err()
}
