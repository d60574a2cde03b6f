package webhook

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
)

const (
	// repeatsWindow is how long a row T7 admission is remembered, to be checked against the
	// workflows the guard's watch delivers next: the case it looks for needs a watch that lags
	// behind a deletion and a new workflow of the name, which it then delivers.
	repeatsWindow = 2 * time.Minute
	// repeatsClockSkew is how much later than the new workflow's first write (to the second,
	// on the API server's clock) an admission must be received to count as after it.
	repeatsClockSkew = 2 * time.Second
	// maxRepeatsRemembered bounds the memory; full, it forgets what has expired, then the
	// oldest.
	maxRepeatsRemembered = 10000
)

// repeatAdmission is a TaskSet create that row T7 admitted: for which workflow (by UID), of
// which TaskSet, received when.
type repeatAdmission struct {
	uid     types.UID
	taskSet string
	at      time.Time
}

// repeats remembers the row T7 admissions by workflow namespace and name, and tells, when the
// guard sees a new workflow of that name first written before such an admission was received,
// that the admission came after the name was reused: exit_guard_repeats_after_reuse_total, an
// error log line, and a Warning Event on the new workflow.
type repeats struct {
	now     func() time.Time
	counter prometheus.Counter

	mu sync.Mutex
	m  map[types.NamespacedName][]repeatAdmission
}

func newRepeats(now func() time.Time) *repeats {
	return &repeats{now: now, m: map[types.NamespacedName][]repeatAdmission{},
		counter: prometheus.NewCounter(prometheus.CounterOpts{Name: "exit_guard_repeats_after_reuse_total",
			Help: "TaskSet creates that row T7 admitted without a read for a workflow whose name, the guard learnt afterwards, another workflow had already taken (the deleted workflow's create: the new workflow's agent may run its task); the case row T7 leaves."})}
}

// note remembers that row T7 admitted a create of taskSet for the workflow wf (namespace and
// name) of uid, received at at.
func (r *repeats) note(wf types.NamespacedName, uid types.UID, taskSet string, at time.Time) {
	now := r.now()
	at = noteAt(at, now)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.m[wf]; !ok {
		makeRoom(r.m, maxRepeatsRemembered, now, repeatsWindow, func(v []repeatAdmission) time.Time { return v[len(v)-1].at })
	}
	kept := r.m[wf][:0]
	for _, a := range r.m[wf] {
		if now.Sub(a.at) <= repeatsWindow && a.uid != uid {
			kept = append(kept, a)
		}
	}
	r.m[wf] = append(kept, repeatAdmission{uid: uid, taskSet: taskSet, at: at})
}

// after returns, and forgets, the admissions remembered for the workflow o names that were
// for another UID and received later than o was written (plus repeatsClockSkew).
func (r *repeats) after(o completionstore.Observation) []repeatAdmission {
	if o.Deleted || o.WrittenAt.IsZero() {
		return nil
	}
	key := types.NamespacedName{Namespace: o.Namespace, Name: o.Name}
	r.mu.Lock()
	defer r.mu.Unlock()
	var found, kept []repeatAdmission
	for _, a := range r.m[key] {
		switch {
		case a.uid != o.UID && a.at.After(o.WrittenAt.Add(repeatsClockSkew)):
			found = append(found, a)
		case r.now().Sub(a.at) <= repeatsWindow:
			kept = append(kept, a)
		}
	}
	if len(kept) == 0 {
		delete(r.m, key)
	} else {
		r.m[key] = kept
	}
	return found
}

// reportRepeatsAfterReuse audits the row T7 admissions that came after the name of their
// workflow was taken by the one o saw: the metric, an error log line, and a Warning Event on
// that workflow.
func (g *guard) reportRepeatsAfterReuse(o completionstore.Observation, found []repeatAdmission) {
	log := logf.Log.WithName("repeats")
	regarding := &argo.Workflow{
		TypeMeta:   metav1.TypeMeta{APIVersion: argo.GroupVersion.String(), Kind: argo.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name, UID: o.UID},
	}
	for _, a := range found {
		g.taskSets().repeats.counter.Inc()
		log.Error(nil, "a TaskSet create of a deleted workflow was admitted without a read (row T7) after another workflow took its name: that workflow's agent may run the deleted workflow's task",
			"workflow", o.Namespace+"/"+o.Name, "workflowUID", o.UID, "deletedWorkflowUID", a.uid, "workflowTaskSet", o.Namespace+"/"+a.taskSet,
			"admittedAt", a.at, "workflowWrittenAt", o.WrittenAt)
		if g.recorder == nil {
			continue
		}
		g.recorder.Eventf(regarding, nil, corev1.EventTypeWarning, contract.EventReasonRepeatAfterReuse, "Admit",
			"a create of WorkflowTaskSet %s by the deleted workflow of this name (uid %s) was admitted without a read (a repeat of one admitted while it ran) after this workflow took the name: "+
				"its agent may run the deleted workflow's task; set --taskset-repeats-for=-1s to read every create", a.taskSet, a.uid)
	}
}

// observedRepeats is the store listener of the row T7 admissions.
func (g *guard) observedRepeats(o completionstore.Observation) {
	if found := g.taskSets().repeats.after(o); len(found) > 0 {
		g.reportRepeatsAfterReuse(o, found)
	}
}
