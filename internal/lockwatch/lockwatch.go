// Package lockwatch finds workflows that wait for an Argo synchronization lock (a mutex or a
// semaphore) which Argo's controller keeps, in its memory, for no workflow that will ever
// release it.
//
// A stale copy of a completed workflow, reconciled by the controller, takes or queues for the
// workflow's locks before its write fails; the completed workflow is never reconciled again,
// so its hold, or its place at the front of the lock's queue, stays until the workflow is
// deleted or the controller restarts (docs/reliability.md, "Held locks"). No webhook sees
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
	"fmt"
	"regexp"
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

// Scan lists the Pending workflows once and updates the metric.
func (w *Watcher) Scan(ctx context.Context) error {
	var ws []waiter
	namespaces := w.opts.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	for _, ns := range namespaces {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(argo.WorkflowGVK.GroupVersion().WithKind(argo.Kind + "List"))
		if err := w.reader.List(ctx, list, client.InNamespace(ns), client.MatchingLabels{argo.LabelPhase: string(argo.PhasePending)}); err != nil {
			return err
		}
		for i := range list.Items {
			if wt, ok := waiterOf(&list.Items[i]); ok {
				ws = append(ws, wt)
			}
		}
	}
	now := w.now()
	completed := map[string]bool{} // holder workflow (namespace/name): completed?
	current := map[string]map[types.UID]bool{}
	seen := map[waitKey]bool{}
	for _, wt := range ws {
		if current[wt.lock] == nil {
			current[wt.lock] = map[types.UID]bool{}
		}
		current[wt.lock][wt.uid] = true
		cause := ""
		switch {
		case wt.free > 0:
			cause = CauseFreeNotGranted
		default:
			for _, h := range wt.holders {
				done, err := w.holderCompleted(ctx, h, completed)
				if err != nil {
					return err
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

	w.stuck.Reset()
	held := map[string]bool{} // lock: running workflows hold all its slots
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
			if cause == CauseFreeNotGranted {
				// The controller rewrites a waiter's message only when it reconciles it:
				// "free" may be old news. Not stuck if running workflows hold every slot.
				full, ok := held[wt.lock]
				if !ok {
					n, err := w.runningHolders(ctx, wt.namespace, wt.lock)
					if err != nil {
						return err
					}
					full = n >= wt.limit
					held[wt.lock] = full
				}
				if full {
					continue
				}
			}
			w.stuck.WithLabelValues(wt.namespace, wt.lock, cause).Inc()
			if !w.reported[k] {
				w.reported[k] = true
				w.opts.Log.Info("a workflow waits on a lock that Argo's controller keeps for a completed workflow: restart the workflow controller to free it",
					"workflow", wt.namespace+"/"+wt.name, "lock", wt.lock, "cause", cause, "holders", wt.holders,
					"stuckFor", now.Sub(since).Round(time.Second).String())
			}
		}
	}
	return nil
}

// runningHolders counts the holds on lock that the Running workflows of namespace declare in
// their status (status.synchronization.mutex.holding[].mutex, .semaphore.holding[]: one per
// holder). Read only for a waiter already suspected, so rarely.
func (w *Watcher) runningHolders(ctx context.Context, namespace, lock string) (int, error) {
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(argo.WorkflowGVK.GroupVersion().WithKind(argo.Kind + "List"))
	if err := w.reader.List(ctx, list, client.InNamespace(namespace), client.MatchingLabels{argo.LabelPhase: string(argo.PhaseRunning)}); err != nil {
		return 0, err
	}
	n := 0
	for _, u := range list.Items {
		for _, kind := range []string{"mutex", "semaphore"} {
			entries, _, _ := unstructured.NestedSlice(u.Object, "status", "synchronization", kind, "holding")
			for _, e := range entries {
				entry, _ := e.(map[string]any)
				if entry == nil || entry[kind] != lock {
					continue
				}
				if hs, ok := entry["holders"].([]any); ok {
					n += len(hs)
				} else {
					n++
				}
			}
		}
	}
	return n, nil
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
