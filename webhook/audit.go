package webhook

import (
	"context"
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// Verdicts, as in metrics and audit annotations.
const (
	verdictAllowed = "allowed"
	verdictDenied  = "denied"
	verdictWarned  = "warned"
	verdictDryRun  = "dry-run"
)

// Event reasons on the workflow: stable, for alerting and `kubectl get events --field-selector`.
const (
	// EventReasonDenied: a pod of the workflow was refused (enforce mode).
	EventReasonDenied = "ExitHandlerDenied"
	// EventReasonWarned: a pod of the workflow would have been refused (warn mode).
	EventReasonWarned = "ExitHandlerWouldBeDenied"
)

// audit records a decision: a metric always; a log line (V(1) for admissions); for a refusal
// (or a would-be refusal in warn mode) a Warning Event on the workflow, unless the request is a
// dry run. It returns the verdict.
func (g *guard) audit(ctx context.Context, req admission.Request, f facts, d decision) string {
	verdict := verdictAllowed
	if d.deny {
		verdict = denyVerdict(g.opts.Mode)
	}
	g.metrics.decisions.WithLabelValues(verdict, string(d.reason), string(f.object)).Inc()
	if d.liveErr != nil {
		kind := "error"
		if errors.Is(d.liveErr, errLiveReadTimeout) {
			kind = "timeout"
		}
		g.metrics.liveReadFailures.WithLabelValues(kind).Inc()
	}

	log := logf.FromContext(ctx)
	unverified := d.reason == reasonUnverified || d.reason == reasonUnconfirmedCompletion
	if !d.deny && !unverified && !log.V(1).Enabled() {
		// The common case: an admission nobody asked to see logged costs no log values.
		return verdict
	}
	if f.object == objectTaskSet {
		log = log.WithValues("workflowTaskSet", f.namespace+"/"+f.name, "tasksAdded", f.tasks, "completedReopened", f.reopened)
	} else {
		log = log.WithValues("pod", f.namespace+"/"+f.name, "podKind", f.kind, "node", f.node)
	}
	log = log.WithValues("reason", d.reason, "verdict", verdict, "mode", g.opts.Mode, "uid", req.UID)
	if f.owner != nil {
		log = log.WithValues("workflow", d.wfNamespace+"/"+d.wfName, "workflowUID", d.wfUID,
			"phase", d.phase, "resourceVersion", d.resourceVersion, "source", d.source)
	}
	if d.liveErr != nil {
		log = log.WithValues("liveReadError", d.liveErr.Error())
	}
	what := "pod"
	if f.object == objectTaskSet {
		what = "WorkflowTaskSet write"
	}
	if !d.deny {
		switch d.reason {
		case reasonUnverified:
			log.Info(what + " admitted unverified: the live read failed and the store knows nothing of its workflow")
		case reasonUnconfirmedCompletion:
			log.Info(what + " admitted unverified: the live read failed and only the store says its workflow completed")
		default:
			log.V(1).Info(what + " admitted")
		}
		return verdict
	}
	log.Info("stale workflow "+what+" refused", "dryRunRequest", req.DryRun != nil && *req.DryRun)

	if g.recorder == nil || (req.DryRun != nil && *req.DryRun) || g.opts.Mode == ModeDryRun {
		return verdict
	}
	reason := EventReasonDenied
	if g.opts.Mode == ModeWarn {
		reason = EventReasonWarned
	}
	regarding := &argo.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: d.wfNamespace, Name: d.wfName, UID: d.wfUID},
	}
	if f.object == objectTaskSet {
		action := "UpdateWorkflowTaskSet"
		if req.Operation == admissionv1.Create {
			action = "CreateWorkflowTaskSet"
		}
		g.recorder.Eventf(regarding, nil, corev1.EventTypeWarning, reason, action,
			"write to WorkflowTaskSet %s refused (it adds %s): workflow is %s, known by %s at resourceVersion %s",
			f.name, tasksText(f), phaseOrGone(d), d.source, d.resourceVersion)
		return verdict
	}
	g.recorder.Eventf(regarding, nil, corev1.EventTypeWarning, reason, "CreatePod",
		"%s pod %s (node %s) refused: workflow is %s, known by %s at resourceVersion %s",
		f.kind, f.name, nodeText(f), phaseOrGone(d), d.source, d.resourceVersion)
	return verdict
}

func phaseOrGone(d decision) string {
	switch d.reason {
	case reasonWorkflowDeleted:
		return "deleted"
	case reasonWorkflowReplaced:
		return "deleted (name reused by another workflow)"
	}
	return string(d.phase)
}

// guardMetrics are the webhook's Prometheus metrics.
type guardMetrics struct {
	decisions        *prometheus.CounterVec
	liveRead         *prometheus.HistogramVec
	liveReadFailures *prometheus.CounterVec
	liveReadAttempts *prometheus.CounterVec
}

func newGuardMetrics() *guardMetrics {
	return &guardMetrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "exit_guard_decisions_total",
			Help: "Admission decisions, by verdict (allowed, denied, warned, dry-run), reason and kind of object (Pod, WorkflowTaskSet).",
		}, []string{"verdict", "reason", "kind"}),
		liveRead: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "exit_guard_live_read_duration_seconds",
			Help: "Latency of live reads of a pod's workflow, by result (found, not-found, timeout, error).",
			// From 1 ms to the 1 s default deadline and a little past it.
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"result"}),
		liveReadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "exit_guard_live_read_failures_total",
			Help: "Live reads that failed or ran out of time, so that the store decided, by kind (timeout, error).",
		}, []string{"kind"}),
		liveReadAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "exit_guard_live_read_retries_total",
			Help: "Further attempts within one live read, by cause: error (the last attempt failed; retried after a pause), hedged (the last attempt had not answered within --live-read-timeout; another started beside it), shed (not started: the process had as many further attempts in flight as it allows).",
		}, []string{"cause"}),
	}
}

// denyVerdict is the verdict a refusal gets in mode.
func denyVerdict(mode Mode) string {
	switch mode {
	case ModeEnforce:
		return verdictDenied
	case ModeWarn:
		return verdictWarned
	default:
		return verdictDryRun
	}
}

// initDecisions creates, at 0, the decision series that alerts count with increase(): the
// refusals of mode and the unverified admissions, for pods and TaskSets. A series that first
// appeared at 1 would hide its first event from increase(), and that event is often the only
// one.
func (m *guardMetrics) initDecisions(mode Mode) {
	for _, kind := range []objectKind{objectPod, objectTaskSet} {
		for _, r := range []reason{reasonWorkflowCompleted, reasonWorkflowDeleted, reasonWorkflowReplaced} {
			m.decisions.WithLabelValues(denyVerdict(mode), string(r), string(kind))
		}
		for _, r := range []reason{reasonUnverified, reasonUnconfirmedCompletion} {
			m.decisions.WithLabelValues(verdictAllowed, string(r), string(kind))
		}
	}
}

func (m *guardMetrics) register(reg prometheus.Registerer) error {
	// The failure series exist from the start, at 0: a rate or an alert on them then reads 0
	// rather than nothing, and a dashboard shows a flat line rather than "no data".
	for _, kind := range []string{"timeout", "error"} {
		m.liveReadFailures.WithLabelValues(kind)
	}
	for _, cause := range []string{"error", "hedged", "shed"} {
		m.liveReadAttempts.WithLabelValues(cause)
	}
	for _, c := range []prometheus.Collector{m.decisions, m.liveRead, m.liveReadFailures, m.liveReadAttempts} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
