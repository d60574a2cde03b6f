// Package check proves that an install of exit-guard works, in one request: a server-side dry
// run of the create of an exit-handler pod owned by a workflow that does not exist. The API
// server sends it through the guard's webhook configuration to the guard, which reads the
// workflow, finds none, and refuses the pod as workflow-deleted (or, in warn and dry-run mode,
// marks it). Nothing is created, and the guard records no Event for a dry run.
package check

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

// The names of the guard's pod webhooks, as the API server quotes them in a refusal (the
// validating one) and in a failed call (either).
const (
	validatingWebhook = "validate.exit-guard.io"
	mutatingWebhook   = "mutate.exit-guard.io"
)

// Options says where to check.
type Options struct {
	// Namespace to send the pod to: one the guard watches and its webhook covers.
	Namespace string
	// Image of the pod's container; the pod is never created, but image policies may look.
	Image string
	// Interval between attempts while the guard does not answer (default 1s).
	Interval time.Duration
}

// Result is what the check saw.
type Result struct {
	// Pod is the name of the dry-run pod, Workflow the name of the workflow it claimed.
	Pod, Workflow string
	// How the guard answered: "denied" (enforce mode) or "marked" (warn or dry-run mode).
	Verdict string
	// Reason is the reason code of a refusal (workflow-deleted).
	Reason contract.Reason
	// Message is the API server's refusal, or the mark's reason.
	Message string
	// Argo is what the guard said of the Argo Workflows release it saw on the pods it judged,
	// in a warning of its answer ("" when it has judged none yet).
	Argo string
}

// argoWarning begins the guard's warning about Argo's release on a dry run's answer.
const argoWarning = "exit-guard: Argo Workflows "

// warnings keeps the guard's warning about Argo's release, as client-go hands warnings over.
type warnings struct {
	mu   sync.Mutex
	argo string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	if strings.HasPrefix(text, argoWarning) {
		w.mu.Lock()
		w.argo = text
		w.mu.Unlock()
	}
}

func (w *warnings) last() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.argo
}

// Run sends the dry-run create and returns what the guard did, or an error that says why the
// install does not work. Until the guard answers (its webhook is not yet served, or the API
// server does not yet send it this namespace's pods), it sends the create again every
// opts.Interval, for as long as ctx allows, and then fails with the last answer; an answer
// from the guard that is not the one wanted fails at once.
func Run(ctx context.Context, cfg *rest.Config, opts Options) (Result, error) {
	if opts.Namespace == "" {
		return Result{}, errors.New("check: a namespace is needed")
	}
	if opts.Image == "" {
		opts.Image = "pause"
	}
	if opts.Interval <= 0 {
		opts.Interval = time.Second
	}
	seen := &warnings{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = seen
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return Result{}, fmt.Errorf("check: reaching the API server: %w", err)
	}
	wf := "exit-guard-check-" + rand.String(8)
	uid := types.UID("00000000-0000-4000-8000-" + rand.String(12))
	started := time.Now()
	var last error
	for attempt := 1; ; attempt++ {
		res, answered, err := once(ctx, c, opts, wf, uid)
		if answered {
			res.Argo = seen.last()
			return res, err
		}
		// An attempt the deadline cut short says less than the one before it.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return res, fmt.Errorf("no answer from the guard in %s (%d attempts); the last: %w", time.Since(started).Round(time.Second), attempt, last)
		case <-time.After(opts.Interval):
		}
	}
}

// once sends the dry-run create once; answered says whether the guard answered it.
func once(ctx context.Context, c client.Client, opts Options, wf string, uid types.UID) (Result, bool, error) {
	pod := Pod(opts.Namespace, wf, uid, opts.Image)
	res := Result{Pod: pod.Name, Workflow: wf}
	err := c.Create(ctx, pod, client.DryRunAll)
	switch {
	case err == nil:
		if reason, ok := pod.Annotations[contract.AnnotationSuspectReason]; ok && pod.Labels[contract.LabelSuspect] == "true" {
			res.Verdict, res.Message = "marked", reason
			return res, true, nil
		}
		return res, false, fmt.Errorf("the API server admitted the dry-run exit-handler pod %s/%s of the workflow %s, which does not exist, unmarked: "+
			"it did not reach the guard, or failed open. Check that the ValidatingWebhookConfiguration exists and covers the namespace %s, "+
			"that the webhook Service has ready endpoints, that the guard watches that namespace (guard.namespaces), "+
			"and the API server's apiserver_admission_webhook_fail_open_count", opts.Namespace, pod.Name, wf, opts.Namespace)
	case isGuardRefusal(err):
		if reason, _ := contract.RefusalReason(err); reason != contract.ReasonWorkflowDeleted {
			return res, true, fmt.Errorf("the guard refused the pod as %s, not because its workflow does not exist (%s): %w", reason, contract.ReasonWorkflowDeleted, err)
		}
		res.Verdict, res.Reason, res.Message = "denied", contract.ReasonWorkflowDeleted, err.Error()
		return res, true, nil
	case ctx.Err() != nil:
		// The deadline ran out during the request: no answer.
		return res, false, fmt.Errorf("the dry-run create did not finish: %w", err)
	case callFailed(err):
		// failurePolicy Fail, and the guard not served (yet).
		return res, false, fmt.Errorf("the API server could not call the guard: %w", err)
	default:
		refused := fmt.Errorf("the dry-run create was refused, but not by the guard (another admission check, or the check's own permissions: it needs create on pods in %s): %w", opts.Namespace, err)
		// The API server's own overload, and permissions still reaching it, pass: try again.
		transient := apierrors.IsTooManyRequests(err) || apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) ||
			apierrors.IsServiceUnavailable(err) || apierrors.IsForbidden(err)
		return res, !transient, refused
	}
}

// callFailed says whether err is the API server's failure to call one of the guard's pod
// webhooks (another webhook's failure is not the guard's).
func callFailed(err error) bool {
	for _, name := range []string{validatingWebhook, mutatingWebhook} {
		if strings.Contains(err.Error(), fmt.Sprintf("failed calling webhook %q", name)) {
			return true
		}
	}
	return false
}

// isGuardRefusal says whether err is a refusal by the guard's pod webhook: one that carries
// the guard's reason code, from the webhook of that name.
func isGuardRefusal(err error) bool {
	return contract.IsRefusal(err) && strings.Contains(err.Error(), fmt.Sprintf("admission webhook %q denied the request", validatingWebhook))
}

// Pod is the exit-handler pod of the check: what Argo's controller creates for the onExit node
// of workflow wf, in a form that passes the restricted Pod Security profile.
func Pod(namespace, wf string, uid types.UID, image string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      wf + "-onexit",
			Labels: map[string]string{
				argo.LabelWorkflow:  wf,
				argo.LabelOnExit:    "true",
				argo.LabelCompleted: "false",
			},
			Annotations: map[string]string{argo.AnnotationNodeName: wf + ".onExit"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: argo.GroupVersion.String(), Kind: argo.Kind, Name: wf, UID: uid, Controller: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:  "main",
				Image: image,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}
