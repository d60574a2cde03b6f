package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// guard holds what both admission paths share.
type guard struct {
	opts       Options
	store      *completionstore.Store
	reader     client.Reader
	recorder   events.EventRecorder
	metrics    *guardMetrics
	denyPhases map[argo.Phase]bool
	watched    map[string]bool // nil: every namespace
	// extraReads holds a token per further live-read attempt in flight (maxExtraLiveReads).
	extraReads chan struct{}
}

// validator is the handler of ValidatePath.
type validator struct{ *guard }

// mutator is the handler of MutatePath.
type mutator struct{ *guard }

var (
	_ admission.Handler = (*validator)(nil)
	_ admission.Handler = (*mutator)(nil)
)

// The live read GETs the owning Workflow (rbac on completionstore.Watch); the audit writes
// Events on it through the events.k8s.io API.
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
//
// The two admission paths, as the API server is to call them. The chart renders these with
// its selectors, match conditions and failure policy; make verify checks it against them.
// +kubebuilder:webhook:path=/validate-pod,mutating=false,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=pods,verbs=create,versions=v1,name=validate.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=5,matchPolicy=Equivalent
// +kubebuilder:webhook:path=/mutate-pod,mutating=true,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups="",resources=pods,verbs=create,versions=v1,name=mutate.exit-guard.io,admissionReviewVersions=v1,timeoutSeconds=5,matchPolicy=Equivalent,reinvocationPolicy=Never

// Setup registers the guard's admission paths on the manager's webhook server. Workflows
// are read live through the manager's API reader (no cache), so the manager's scheme must know
// argo.Workflow (argo.AddToScheme).
func Setup(mgr manager.Manager, store *completionstore.Store, opts Options) error {
	return setup(mgr, mgr.GetAPIReader(), store, opts)
}

// setup is Setup with the reader of live reads given.
func setup(mgr manager.Manager, reader client.Reader, store *completionstore.Store, opts Options) error {
	g, err := newGuard(reader, store, opts)
	if err != nil {
		return err
	}
	if !mgr.GetScheme().Recognizes(argo.WorkflowGVK) {
		return errors.New("webhook: the manager's scheme does not know argo.Workflow; call argo.AddToScheme")
	}
	g.recorder = mgr.GetEventRecorder(g.opts.EventSource)
	reg := g.opts.Registerer
	if reg == nil {
		reg = metrics.Registry
	}
	if err := g.metrics.register(reg); err != nil {
		return fmt.Errorf("webhook: registering metrics: %w", err)
	}
	g.metrics.initDecisions(g.opts.Mode)
	srv := mgr.GetWebhookServer()
	srv.Register(ValidatePath, serve(&validator{g}))
	srv.Register(MutatePath, serve(&mutator{g}))
	srv.Register(ValidateTaskSetPath, serve(&taskSetValidator{g}))
	return nil
}

// serve is the HTTP handler of an admission handler: controller-runtime's decoding and panic
// recovery, then withHTTPStatus.
func serve(h admission.Handler) http.Handler {
	return withHTTPStatus(&admission.Webhook{Handler: h})
}

func newGuard(reader client.Reader, store *completionstore.Store, opts Options) (*guard, error) {
	if store == nil {
		return nil, errors.New("webhook: Setup needs a completion store")
	}
	if err := opts.complete(); err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	g := &guard{opts: opts, store: store, reader: reader, metrics: newGuardMetrics(), denyPhases: map[argo.Phase]bool{},
		extraReads: make(chan struct{}, maxExtraLiveReads)}
	for _, p := range opts.DenyPhases {
		g.denyPhases[p] = true
	}
	if len(opts.Namespaces) > 0 {
		g.watched = map[string]bool{}
		for _, ns := range opts.Namespaces {
			g.watched[ns] = true
		}
	}
	return g, nil
}

// podMetadata is the only part of a pod the guard decodes.
type podMetadata struct {
	Metadata metav1.ObjectMeta `json:"metadata"`
}

var podResource = metav1.GroupVersionResource{Version: "v1", Resource: "pods"}

// read checks that req is a Pod CREATE and decodes the pod's metadata. A nil response means go
// on; otherwise it is the answer: allowed for requests that are not ours, 400 for malformed ones.
func read(req admission.Request) (*metav1.ObjectMeta, *admission.Response) {
	if req.UID == "" {
		r := admission.Errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.uid is empty"))
		return nil, &r
	}
	if req.Resource != podResource || req.SubResource != "" {
		r := admission.Allowed(fmt.Sprintf("exit-guard only reviews pods, not %s", resourceName(req)))
		return nil, &r
	}
	if req.Operation != admissionv1.Create {
		r := admission.Allowed(fmt.Sprintf("exit-guard only reviews pod creation, not %s", req.Operation))
		return nil, &r
	}
	if len(req.Object.Raw) == 0 {
		r := admission.Errored(http.StatusBadRequest, errors.New("malformed AdmissionReview: request.object is empty"))
		return nil, &r
	}
	var pod podMetadata
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		r := admission.Errored(http.StatusBadRequest, fmt.Errorf("malformed AdmissionReview: request.object is not a pod: %w", err))
		return nil, &r
	}
	if pod.Metadata.Namespace == "" {
		// The API server sends the pod before defaulting its namespace from the request.
		pod.Metadata.Namespace = req.Namespace
	}
	return &pod.Metadata, nil
}

func resourceName(req admission.Request) string {
	r := req.Resource.Resource
	if req.Resource.Group != "" {
		r += "." + req.Resource.Group
	}
	if req.SubResource != "" {
		r += "/" + req.SubResource
	}
	return r
}

// Handle decides a pod creation: deny in enforce mode; in warn and dry-run mode admit, with the
// same audit.
func (v *validator) Handle(ctx context.Context, req admission.Request) admission.Response {
	meta, resp := read(req)
	if resp != nil {
		return *resp
	}
	f, d := v.decide(ctx, meta)
	out := v.audit(ctx, req, f, d)
	if !d.deny {
		return withAudit(admission.Allowed(string(d.reason)), f, d, out)
	}
	msg := denialMessage(f, d)
	switch v.opts.Mode {
	case ModeEnforce:
		return policyDenial(ctx, withAudit(admission.Denied(msg), f, d, out))
	case ModeWarn:
		return withAudit(admission.Allowed(string(d.reason)).WithWarnings("exit-guard (warn mode) would refuse this pod: "+msg), f, d, out)
	default:
		return withAudit(admission.Allowed(string(d.reason)), f, d, out)
	}
}

// Handle marks a suspect pod in warn and dry-run mode: a label to find it by and the reason in
// an annotation. In enforce mode it changes nothing; the validating path decides.
func (m *mutator) Handle(ctx context.Context, req admission.Request) admission.Response {
	meta, resp := read(req)
	if resp != nil {
		return *resp
	}
	if m.opts.Mode == ModeEnforce {
		return admission.Allowed("enforce mode: the validating webhook decides")
	}
	f, d := m.decide(ctx, meta)
	out := m.audit(ctx, req, f, d)
	if !d.deny {
		return withAudit(admission.Allowed(string(d.reason)), f, d, out)
	}
	msg := denialMessage(f, d)
	r := admission.Allowed(string(d.reason))
	r.Patches = suspectPatch(meta, msg)
	if m.opts.Mode == ModeWarn {
		r = r.WithWarnings("exit-guard (warn mode) would refuse this pod: " + msg)
	}
	return withAudit(r, f, d, out)
}

// suspectPatch adds LabelSuspect and AnnotationSuspectReason, and nothing else.
func suspectPatch(meta *metav1.ObjectMeta, msg string) []jsonpatch.Operation {
	var ops []jsonpatch.Operation
	if meta.Labels == nil {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/labels", map[string]string{LabelSuspect: "true"}))
	} else {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/labels/"+escapePointer(LabelSuspect), "true"))
	}
	if meta.Annotations == nil {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations", map[string]string{AnnotationSuspectReason: msg}))
	} else {
		ops = append(ops, jsonpatch.NewOperation("add", "/metadata/annotations/"+escapePointer(AnnotationSuspectReason), msg))
	}
	return ops
}

// escapePointer escapes a map key for a JSON pointer (RFC 6901).
func escapePointer(s string) string {
	var b bytes.Buffer
	for _, r := range s {
		switch r {
		case '~':
			b.WriteString("~0")
		case '/':
			b.WriteString("~1")
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// denialMessage says what happened, which workflow and phase, and where to look.
func denialMessage(f facts, d decision) string {
	var what string
	switch d.reason {
	case reasonWorkflowDeleted:
		what = fmt.Sprintf("workflow %s/%s (uid %s) no longer exists", d.wfNamespace, d.wfName, d.wfUID)
	case reasonWorkflowReplaced:
		what = fmt.Sprintf("workflow %s/%s (uid %s) was deleted; that name now belongs to another workflow", d.wfNamespace, d.wfName, d.wfUID)
	default:
		what = fmt.Sprintf("workflow %s/%s (uid %s) already reached %s (resourceVersion %s)", d.wfNamespace, d.wfName, d.wfUID, d.phase, d.resourceVersion)
	}
	var refused, tried string
	if f.object == objectTaskSet {
		refused = fmt.Sprintf("a write to WorkflowTaskSet %s/%s that adds %s", f.namespace, f.name, tasksText(f))
		tried = "run its HTTP or plugin tasks again"
	} else {
		refused = fmt.Sprintf("%s pod %s for node %s", f.kind, f.name, nodeText(f))
		tried = "run it again"
	}
	return fmt.Sprintf("exit-guard refused %s: %s, as seen by %s; "+
		"a stale copy of a completed workflow tried to %s. "+
		"See the workflow's events: kubectl -n %s get events --field-selector involvedObject.name=%s",
		refused, what, d.source, tried, d.wfNamespace, d.wfName)
}

// nodeText names what a pod runs, for messages and Events.
func nodeText(f facts) string {
	switch {
	case f.kind == kindAgent:
		return "(the workflow's HTTP and plugin tasks)"
	case f.node == "":
		return "(no node-name annotation)"
	}
	return f.node
}

// withAudit adds the audit annotations that the API server writes into its audit log, under
// the webhook's name.
func withAudit(r admission.Response, f facts, d decision, verdict string) admission.Response {
	a := map[string]string{"decision": verdict, "reason": string(d.reason), "kind": string(f.object)}
	if f.owner != nil {
		a["workflow"] = d.wfNamespace + "/" + d.wfName
		a["workflow-uid"] = string(d.wfUID)
		if f.object == objectPod {
			a["pod-kind"] = string(f.kind)
		}
	}
	if len(f.tasks) > 0 {
		a["tasks-added"] = strings.Join(f.tasks[:min(len(f.tasks), maxTasksNamed)], ",")
	}
	if f.reopened {
		a["completed-reopened"] = "true"
	}
	if d.source != sourceNone {
		a["source"] = string(d.source)
	}
	if d.phase != "" {
		a["phase"] = string(d.phase)
	}
	r.AuditAnnotations = a
	return r
}

// policyMark is put in each request's context by withHTTPStatus; the validator sets it when it
// answers with one of its own policy refusals, and only then.
type policyMark struct{ denied bool }

type policyMarkKey struct{}

// policyDenial marks r as the guard's own policy refusal and returns it. It is the last thing
// the validator does, so a panic on the way to a refusal leaves the mark unset.
func policyDenial(ctx context.Context, r admission.Response) admission.Response {
	if m, ok := ctx.Value(policyMarkKey{}).(*policyMark); ok {
		m.denied = true
	}
	return r
}

// withHTTPStatus makes every refusal that is not one of the guard's policy decisions an HTTP
// error: a malformed request gets HTTP 400 (or 413), and anything else (a panic that
// controller-runtime recovered into an answer with code 500, any future bug) HTTP 500. The API
// server then applies the webhook's failurePolicy instead of reading a refusal: an
// AdmissionReview with allowed: false in an HTTP 200 is a denial whatever that policy says.
// Admissions and the guard's own refusals pass through unchanged.
func withHTTPStatus(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mark := &policyMark{}
		r = r.WithContext(context.WithValue(r.Context(), policyMarkKey{}, mark))
		rec := &bufferedWriter{header: w.Header()}
		h.ServeHTTP(rec, r)
		status := http.StatusOK
		// Admissions are the common case: parse only refusals.
		if bytes.Contains(rec.body.Bytes(), []byte(`"allowed":false`)) {
			var review admissionv1.AdmissionReview
			switch err := json.Unmarshal(rec.body.Bytes(), &review); {
			case err != nil || review.Response == nil:
				status = http.StatusInternalServerError
			case review.Response.Allowed:
			case mark.denied && review.Response.Result != nil && review.Response.Result.Code == http.StatusForbidden:
				// The guard's own policy refusal.
			case review.Response.Result != nil && review.Response.Result.Code >= 400 && review.Response.Result.Code < 600 &&
				review.Response.Result.Code != http.StatusForbidden:
				status = int(review.Response.Result.Code)
			default:
				status = http.StatusInternalServerError
			}
		}
		w.WriteHeader(status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

type bufferedWriter struct {
	header http.Header
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header         { return b.header }
func (b *bufferedWriter) Write(p []byte) (int, error) { return b.body.Write(p) }
func (b *bufferedWriter) WriteHeader(int)             {}
