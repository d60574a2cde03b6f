package webhook

import (
	"context"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// simReader answers live reads from the truth at the decision's virtual moment, failing the
// attempts its plan says.
type simReader struct {
	h *history
}

// List is the first read of each attempt (readWorkflow): the workflow's metadata by name, its
// labels written as Argo's controller writes them with its phase (none for a workflow not yet
// reconciled, whose phase only Get tells).
func (s *simReader) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	now, fail := nextAttemptFails(ctx)
	if fail {
		return apierrors.NewServiceUnavailable("simulated: the API server cannot answer")
	}
	var lo client.ListOptions
	lo.ApplyOptions(opts)
	name, _ := lo.FieldSelector.RequiresExactMatch("metadata.name")
	l := list.(*metav1.PartialObjectMetadataList)
	l.Items = nil
	if _, _, holder := s.h.truth("", now); holder.uid != "" {
		item := metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: lo.Namespace, Name: name, UID: holder.uid,
			ResourceVersion: strconv.FormatInt(holder.rv, 10)}}
		if holder.phase != argo.PhaseUnknown {
			item.Labels = map[string]string{argo.LabelPhase: string(holder.phase), argo.LabelCompleted: strconv.FormatBool(holder.phase.Terminal())}
		}
		l.Items = append(l.Items, item)
	}
	return nil
}

// Get is the second read of an attempt whose labels did not settle the phase, at the same
// moment.
func (s *simReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	_, _, holder := s.h.truth("", decisionMoment(ctx))
	if holder.uid == "" {
		return apierrors.NewNotFound(schema.GroupResource{Group: argo.Group, Resource: argo.Resource}, key.Name)
	}
	if wf, ok := obj.(*argo.WorkflowNodes); ok {
		// The whole read of row T6: the holder's node of the task, once it has written it.
		p, _ := ctx.Value(planKey{}).(*decisionPlan)
		wf.Namespace, wf.Name, wf.UID = key.Namespace, key.Name, holder.uid
		wf.Status.Phase = holder.phase
		wf.Status.Nodes = map[string]argo.Node{}
		if p != nil && p.nodeWritten {
			wf.Status.Nodes[p.task] = argo.Node{Name: p.node, Type: argo.NodeTypeHTTP, Phase: "Pending"}
		}
		return nil
	}
	wf := obj.(*argo.Workflow)
	wf.Namespace, wf.Name, wf.UID = key.Namespace, key.Name, holder.uid
	wf.ResourceVersion = strconv.FormatInt(holder.rv, 10)
	wf.Status.Phase = holder.phase
	return nil
}

// decisionPlan is one decision's live-read plan: which attempts fail, and the moment. It
// travels in the decision's context (the live read keeps its values), so that an attempt that
// starts late still belongs to its own decision.
type decisionPlan struct {
	mu  sync.Mutex
	now time.Duration
	// truthAt is the moment whose truth the live read answers: now, but for a legitimate
	// pod tried again after its workflow, in the generated history, moved on to a completion,
	// the moment of its first try. The history is fixed in advance, and in it the workflow
	// completes on time; on a real controller a node left Pending by a refusal holds the
	// workflow back until its pod is created, so the read would find it as it was.
	truthAt time.Duration
	plan    []bool
	called  int
	// task is the task a TaskSet write adds, and nodeWritten says whether its node is in
	// the writer's status (a later pass than the one that created it).
	task, node  string
	nodeWritten bool
}

type planKey struct{}

// next says whether the next attempt of the decision in ctx fails.
func nextAttemptFails(ctx context.Context) (now time.Duration, fail bool) {
	p, ok := ctx.Value(planKey{}).(*decisionPlan)
	if !ok {
		return 0, true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.called
	p.called++
	return p.truthAt, k >= len(p.plan) || p.plan[k]
}

// decisionMoment is the virtual moment whose truth the decision in ctx reads.
func decisionMoment(ctx context.Context) time.Duration {
	p, ok := ctx.Value(planKey{}).(*decisionPlan)
	if !ok {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.truthAt
}
