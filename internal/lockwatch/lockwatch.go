// Package lockwatch finds workflows that wait for an Argo synchronization lock (a mutex or a
// semaphore) which Argo's controller keeps, in its memory, for no workflow that will ever
// release it.
//
// A stale copy of a completed workflow, reconciled by the controller, takes or queues for the
// workflow's locks before its write fails; the completed workflow is never reconciled again,
// so its hold, or its place at the front of the lock's queue, stays until the workflow is
// deleted or the controller restarts (docs/evidence/reliability.md, "Held locks"). No webhook sees
// this: the lock lives in the controller's memory. What the API server does see is the
// waiters' status, which the controller writes: a Pending workflow whose message is "Waiting
// for <lock> lock. Lock status: <free>/<limit>", and whose status.synchronization names the
// holder it waits behind.
//
// A waiter is stuck when, for StuckAfter, it waited on a lock that either had a free slot
// (the queue's front is a completed workflow) or was held by a completed workflow, and no
// waiter of that lock got it in the meantime. The Watcher exports the stuck waiters as
// exit_guard_sync_stuck_workflows and logs each once; the chart's ExitGuardSyncLockStuck alert
// names the remedy (restart the workflow controller).
package lockwatch

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// Causes of a stuck waiter, the values of the metric's cause label.
const (
	// CauseFreeNotGranted: the lock has a free slot, yet the waiter is not given it (the
	// front of the lock's queue is a completed workflow's pending entry).
	CauseFreeNotGranted = "free-not-granted"
	// CauseHeldByCompleted: the waiter waits behind a holder whose workflow has completed.
	CauseHeldByCompleted = "held-by-completed"
)

// Options configure a Watcher.
type Options struct {
	// Interval between scans (default 1 minute).
	Interval time.Duration
	// StuckAfter is how long a waiter must be stuck, with no waiter of its lock served, before
	// it is reported (default 5 minutes).
	StuckAfter time.Duration
	// Namespaces to scan; none: every namespace.
	Namespaces []string
	// Registerer receives the metric (required).
	Registerer prometheus.Registerer
	// Log receives a line for each waiter found stuck.
	Log logr.Logger
}

// Watcher scans the Pending workflows for stuck waiters. It is a manager.Runnable that runs on
// every replica (the alert takes the maximum).
type Watcher struct {
	reader client.Reader
	opts   Options
	stuck  *prometheus.GaugeVec
	now    func() time.Time

	// suspect: since when each waiter has been seen stuck (by UID, lock and cause).
	suspect map[waitKey]time.Time
	// waiters: the waiters of each lock at the last scan; served: when a waiter of a lock
	// last stopped waiting on it (it got the lock, or went away).
	waiters map[string]map[types.UID]bool
	served  map[string]time.Time
	// reported: the waiters logged as stuck, so that each is logged once.
	reported map[waitKey]bool
}

type waitKey struct {
	uid         types.UID
	lock, cause string
}

// New returns a Watcher that reads workflows through reader (live reads: a cache of
// metadata cannot see the waiters' status).
func New(reader client.Reader, opts Options) (*Watcher, error) {
	if opts.Interval <= 0 {
		opts.Interval = time.Minute
	}
	if opts.StuckAfter <= 0 {
		opts.StuckAfter = 5 * time.Minute
	}
	if opts.Registerer == nil {
		return nil, fmt.Errorf("lockwatch: a Registerer is required")
	}
	w := &Watcher{reader: reader, opts: opts, now: time.Now,
		stuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "exit_guard_sync_stuck_workflows",
			Help: "Workflows waiting on an Argo synchronization lock that Argo's controller keeps for a completed workflow (cause free-not-granted: the lock has a free slot but a completed workflow's entry heads its queue; held-by-completed: a completed workflow holds it), by the waiters' namespace, the lock and the cause. Restart the workflow controller to free it.",
		}, []string{"workflow_namespace", "lock", "cause"}),
		suspect: map[waitKey]time.Time{}, waiters: map[string]map[types.UID]bool{},
		served: map[string]time.Time{}, reported: map[waitKey]bool{}}
	if err := opts.Registerer.Register(w.stuck); err != nil {
		return nil, fmt.Errorf("lockwatch: registering metrics: %w", err)
	}
	return w, nil
}

// NeedLeaderElection is false: every replica scans (the guard elects no leader).
func (w *Watcher) NeedLeaderElection() bool { return false }

// Start scans every Interval until ctx ends.
func (w *Watcher) Start(ctx context.Context) error {
	t := time.NewTicker(w.opts.Interval)
	defer t.Stop()
	for {
		if err := w.Scan(ctx); err != nil && ctx.Err() == nil {
			w.opts.Log.Error(err, "scanning the Pending workflows for stuck lock waiters; the next scan tries again")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// waitMessage is the message Argo's controller gives a workflow waiting on a workflow-level
// lock (sync/semaphore.go, v3.4 to v4.0).
var waitMessage = regexp.MustCompile(`^Waiting for (\S+) lock\. Lock status: (\d+)/(\d+)`)

// waiter is a Pending workflow waiting on a lock, as its status says.
type waiter struct {
	uid       types.UID
	namespace string
	name      string
	lock      string
	free      int
	limit     int
	holders   []string // namespace/name[/nodeID] of the holders it waits behind
}

// Scan lists the Pending workflows once and updates the metric. A namespace or a holder it
// cannot read is left out of this scan (and returned as an error); the rest is still counted.
func (w *Watcher) Scan(ctx context.Context) error {
	var errs []error
	var ws []waiter
	declared := map[string][]types.UID{} // lock: the Pending workflows whose spec names it
	namespaces := w.opts.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	for _, ns := range namespaces {
		list, err := w.list(ctx, ns, argo.PhasePending)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i := range list.Items {
			u := &list.Items[i]
			for _, lock := range declaredLocks(u) {
				declared[lock] = append(declared[lock], u.GetUID())
			}
			if wt, ok := waiterOf(u); ok {
				ws = append(ws, wt)
			}
		}
	}
	now := w.now()
	completed := map[string]bool{}         // holder workflow (namespace/name): completed?
	running := map[string]map[string]int{} // namespace: lock: holds the Running workflows declare
	current := map[string]map[types.UID]bool{}
	seen := map[waitKey]bool{}
	for _, wt := range ws {
		if current[wt.lock] == nil {
			current[wt.lock] = map[types.UID]bool{}
		}
		current[wt.lock][wt.uid] = true
		cause := ""
		if wt.free > 0 {
			cause = CauseFreeNotGranted
		} else {
			for _, h := range wt.holders {
				done, err := w.holderCompleted(ctx, h, completed)
				if err != nil {
					errs = append(errs, err)
					break
				}
				if done {
					cause = CauseHeldByCompleted
					break
				}
			}
		}
		if cause == "" {
			continue
		}
		k := waitKey{wt.uid, wt.lock, cause}
		seen[k] = true
		if _, ok := w.suspect[k]; !ok {
			w.suspect[k] = now
		}
	}
	// A waiter that no longer waits on its lock was served (or went away): the lock moves.
	for lock, before := range w.waiters {
		for uid := range before {
			if !current[lock][uid] {
				w.served[lock] = now
			}
		}
	}
	w.waiters = current
	for k := range w.suspect {
		if !seen[k] {
			delete(w.suspect, k)
			delete(w.reported, k)
		}
	}
	for lock, at := range w.served {
		if current[lock] == nil && now.Sub(at) > w.opts.StuckAfter {
			delete(w.served, lock)
		}
	}

	type series struct{ namespace, lock, cause string }
	stuck := map[series]float64{}
	for _, wt := range ws {
		for _, cause := range []string{CauseFreeNotGranted, CauseHeldByCompleted} {
			k := waitKey{wt.uid, wt.lock, cause}
			since, ok := w.suspect[k]
			if !ok {
				continue
			}
			if s, ok := w.served[wt.lock]; ok && s.After(since) {
				since = s
			}
			if now.Sub(since) < w.opts.StuckAfter {
				continue
			}
			// The controller rewrites a waiter's status only when it reconciles it, and it
			// wakes only as many waiters as slots come free: "free", or "held by" a workflow
			// that has since completed, may be old news. Not stuck while Running workflows
			// declare every slot held.
			lockNS := strings.SplitN(wt.lock, "/", 2)[0]
			holds, ok := running[lockNS]
			if !ok {
				var err error
				if holds, err = w.runningHolds(ctx, lockNS); err != nil {
					errs = append(errs, err)
					continue
				}
				running[lockNS] = holds
			}
			if holds[wt.lock] >= wt.limit {
				continue
			}
			// A Pending workflow that names this lock but waits on another one may head this
			// lock's queue (Argo 3.6 and later take several locks at once): an ordinary wait.
			if cause == CauseFreeNotGranted && slices.ContainsFunc(declared[wt.lock], func(uid types.UID) bool {
				return !current[wt.lock][uid]
			}) {
				continue
			}
			stuck[series{wt.namespace, wt.lock, cause}]++
			if !w.reported[k] {
				w.reported[k] = true
				w.opts.Log.Info("a workflow waits on a lock that Argo's controller keeps for a completed workflow: restart the workflow controller to free it",
					"workflow", wt.namespace+"/"+wt.name, "lock", wt.lock, "cause", cause, "holders", wt.holders,
					"stuckFor", now.Sub(since).Round(time.Second).String())
			}
		}
	}
	// Swapped in at once: a scrape never sees a half-filled scan.
	w.stuck.Reset()
	for s, n := range stuck {
		w.stuck.WithLabelValues(s.namespace, s.lock, s.cause).Set(n)
	}
	return errors.Join(errs...)
}

// list reads the workflows of namespace in phase, from the API server's watch cache
// (resourceVersion 0: no read of etcd; a moment old at most, which a detector of waits of
// minutes can afford).
func (w *Watcher) list(ctx context.Context, namespace string, phase argo.Phase) (*unstructured.UnstructuredList, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(argo.WorkflowGVK.GroupVersion().WithKind(argo.Kind + "List"))
	err := w.reader.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{argo.LabelPhase: string(phase)},
		&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: "0"}})
	if err != nil {
		return nil, fmt.Errorf("listing the %s workflows of namespace %q: %w", phase, namespace, err)
	}
	return list, nil
}

// runningHolds counts, by lock, the holds the Running workflows of namespace declare in their
// status (status.synchronization.mutex.holding[].mutex, .semaphore.holding[].holders: one per
// holder). Read only once a waiter has been suspected for StuckAfter, so rarely.
func (w *Watcher) runningHolds(ctx context.Context, namespace string) (map[string]int, error) {
	list, err := w.list(ctx, namespace, argo.PhaseRunning)
	if err != nil {
		return nil, err
	}
	holds := map[string]int{}
	for _, u := range list.Items {
		for _, kind := range []string{"mutex", "semaphore"} {
			entries, _, _ := unstructured.NestedSlice(u.Object, "status", "synchronization", kind, "holding")
			for _, e := range entries {
				entry, _ := e.(map[string]any)
				lock, _ := entry[kind].(string)
				if lock == "" {
					continue
				}
				if hs, ok := entry["holders"].([]any); ok {
					holds[lock] += len(hs)
				} else {
					holds[lock]++
				}
			}
		}
	}
	return holds, nil
}

// declaredLocks are the keys of the workflow-level locks u's spec names (mutex, mutexes,
// semaphore, semaphores), as Argo's controller keys them: <namespace>/Mutex/<name> and
// <namespace>/ConfigMap/<name>/<key>.
func declaredLocks(u *unstructured.Unstructured) []string {
	sync, _, _ := unstructured.NestedMap(u.Object, "spec", "synchronization")
	var locks []string
	one := func(m map[string]any, semaphore bool) {
		ns, _ := m["namespace"].(string)
		if ns == "" {
			ns = u.GetNamespace()
		}
		if !semaphore {
			if name, _ := m["name"].(string); name != "" {
				locks = append(locks, ns+"/Mutex/"+name)
			}
			return
		}
		ref, _ := m["configMapKeyRef"].(map[string]any)
		name, _ := ref["name"].(string)
		key, _ := ref["key"].(string)
		if name != "" && key != "" {
			locks = append(locks, ns+"/ConfigMap/"+name+"/"+key)
		}
	}
	for _, kind := range []struct {
		single, many string
		semaphore    bool
	}{{"mutex", "mutexes", false}, {"semaphore", "semaphores", true}} {
		if m, ok := sync[kind.single].(map[string]any); ok {
			one(m, kind.semaphore)
		}
		if ms, ok := sync[kind.many].([]any); ok {
			for _, e := range ms {
				if m, ok := e.(map[string]any); ok {
					one(m, kind.semaphore)
				}
			}
		}
	}
	return locks
}

// holderCompleted says whether the workflow of holder (namespace/name[/nodeID]) has completed,
// by its labels; a holder that is gone is not counted (Argo's own existence check frees it).
func (w *Watcher) holderCompleted(ctx context.Context, holder string, memo map[string]bool) (bool, error) {
	parts := strings.SplitN(holder, "/", 3)
	if len(parts) < 2 {
		return false, nil // v3.4's holding entries name the workflow alone; waiting ones carry the namespace
	}
	key := parts[0] + "/" + parts[1]
	if done, ok := memo[key]; ok {
		return done, nil
	}
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(argo.WorkflowGVK)
	err := w.reader.Get(ctx, client.ObjectKey{Namespace: parts[0], Name: parts[1]}, m)
	if client.IgnoreNotFound(err) != nil {
		return false, err
	}
	done := err == nil && argo.PhaseFromLabels(m.GetLabels()).Terminal()
	memo[key] = done
	return done, nil
}

// waiterOf reads a Pending workflow's wait, if it waits on a workflow-level lock.
func waiterOf(u *unstructured.Unstructured) (waiter, bool) {
	msg, _, _ := unstructured.NestedString(u.Object, "status", "message")
	m := waitMessage.FindStringSubmatch(msg)
	if m == nil {
		return waiter{}, false
	}
	free, _ := strconv.Atoi(m[2])
	limit, _ := strconv.Atoi(m[3])
	wt := waiter{uid: u.GetUID(), namespace: u.GetNamespace(), name: u.GetName(), lock: m[1], free: free, limit: limit}
	// status.synchronization.mutex.waiting[].holder; .semaphore.waiting[].holders[].
	for _, kind := range []string{"mutex", "semaphore"} {
		entries, _, _ := unstructured.NestedSlice(u.Object, "status", "synchronization", kind, "waiting")
		for _, e := range entries {
			entry, _ := e.(map[string]any)
			if entry == nil {
				continue
			}
			if lock, _ := entry[kind].(string); lock != wt.lock {
				continue
			}
			if h, ok := entry["holder"].(string); ok {
				wt.holders = append(wt.holders, h)
			}
			if hs, ok := entry["holders"].([]any); ok {
				for _, h := range hs {
					if s, ok := h.(string); ok {
						wt.holders = append(wt.holders, s)
					}
				}
			}
		}
	}
	return wt, true
}
