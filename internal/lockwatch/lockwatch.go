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

// DefaultOptions are the Watcher's defaults, the only place they are written (the command
// line binds its flags into a copy of them; New fills unset fields from them).
func DefaultOptions() Options {
	return Options{Interval: time.Minute, StuckAfter: 5 * time.Minute}
}

// Options configure a Watcher.
type Options struct {
	// Interval between scans.
	Interval time.Duration
	// StuckAfter is how long a waiter must be stuck, with no waiter of its lock served, before
	// it is reported.
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
	// page is how many workflows one request lists (listPage).
	page int64

	// suspect: since when each waiter has been seen stuck (by UID, lock and cause).
	suspect map[waitKey]time.Time
	// waiters: the waiters of each lock at the last scan; served: when a waiter of a lock
	// last stopped waiting on it (it got the lock, or went away).
	waiters map[string]map[types.UID]bool
	served  map[string]time.Time
	// reported: the waiters logged as stuck, so that each is logged once.
	reported map[waitKey]bool
	// lastStuck: the waiters the last scan counted stuck (a scan that cannot read a lock's
	// holds counts them as that scan did).
	lastStuck map[waitKey]bool
}

type waitKey struct {
	uid         types.UID
	lock, cause string
}

// New returns a Watcher that reads workflows through reader, a live client from NewReader (a
// cache of metadata cannot see the waiters' status).
func New(reader client.Reader, opts Options) (*Watcher, error) {
	def := DefaultOptions()
	if opts.Interval <= 0 {
		opts.Interval = def.Interval
	}
	if opts.StuckAfter <= 0 {
		opts.StuckAfter = def.StuckAfter
	}
	if opts.Registerer == nil {
		return nil, fmt.Errorf("lockwatch: a Registerer is required")
	}
	w := &Watcher{reader: reader, opts: opts, now: time.Now, page: listPage,
		stuck: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "exit_guard_sync_stuck_workflows",
			Help: "Workflows waiting on an Argo synchronization lock that Argo's controller keeps for a completed workflow (cause free-not-granted: the lock has a free slot but a completed workflow's entry heads its queue; held-by-completed: a completed workflow holds it), by the waiters' namespace, the lock and the cause. Restart the workflow controller to free it."}, []string{"workflow_namespace", "lock", "cause"}),
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

// Scan lists the Pending workflows once and updates the metric. A scan that could not list
// every Pending workflow changes nothing (no timer, no gauge) and returns the error: a waiter on
// a page it could not read is not a waiter served, and a flaky API server must not keep
// restarting the stuck timers. A holder or a lock's holds it cannot read leave that waiter as
// the last scan found it (its timer runs on, its gauge stays); the rest is counted.
func (w *Watcher) Scan(ctx context.Context) error {
	var errs []error
	var ws []waiter
	declared := map[string][]types.UID{} // lock: the Pending workflows whose spec names it
	namespaces := w.opts.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	for _, ns := range namespaces {
		err := w.list(ctx, ns, argo.PhasePending, func(v *workflowView) {
			for _, lock := range declaredLocks(v) {
				declared[lock] = append(declared[lock], v.UID)
			}
			if wt, ok := waiterOf(v); ok {
				ws = append(ws, wt)
			}
		})
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("lockwatch: the scan did not list every Pending workflow, and changed nothing: %w", errors.Join(errs...))
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
			unknown := false
			for _, h := range wt.holders {
				done, err := w.holderCompleted(ctx, h, completed)
				if err != nil {
					errs = append(errs, err)
					unknown = true
					break
				}
				if done {
					cause = CauseHeldByCompleted
					break
				}
			}
			if unknown {
				// Not known this scan: the waiter stays as it was, its timer running (held
				// by a completed workflow, the only cause a waiter with no free slot has).
				if k := (waitKey{wt.uid, wt.lock, CauseHeldByCompleted}); !w.suspect[k].IsZero() {
					seen[k] = true
				}
				continue
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
	counted := map[waitKey]bool{}
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
					holds = nil
				}
				running[lockNS] = holds
			}
			if holds == nil {
				// The lock's holds could not be read: as the last scan counted it.
				if w.lastStuck[k] {
					stuck[series{wt.namespace, wt.lock, cause}]++
					counted[k] = true
				}
				continue
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
			counted[k] = true
			if !w.reported[k] {
				w.reported[k] = true
				w.opts.Log.Info("a workflow waits on a lock that Argo's controller keeps for a completed workflow: restart the workflow controller to free it",
					"workflow", wt.namespace+"/"+wt.name, "lock", wt.lock, "cause", cause, "holders", wt.holders,
					"stuckFor", now.Sub(since).Round(time.Second).String())
			}
		}
	}
	w.lastStuck = counted
	// Swapped in at once: a scrape never sees a half-filled scan.
	w.stuck.Reset()
	for s, n := range stuck {
		w.stuck.WithLabelValues(s.namespace, s.lock, s.cause).Set(n)
	}
	return errors.Join(errs...)
}

// listPage is how many workflows one request of a scan lists: what the scan holds at once is a
// page, whatever the namespace holds (a page of 1 MB workflows is 100 MB on the wire, decoded
// into views of a few hundred bytes each).
const listPage = 100

// list calls each with every workflow of namespace in phase, read page by page (w.page) as
// views (workflowView: no node tree). A page is read from the API server consistently, from its
// watch cache where it serves pages (Kubernetes 1.34 and later), else from etcd: once a scan
// interval, and the Running workflows only for a suspect waiter.
func (w *Watcher) list(ctx context.Context, namespace string, phase argo.Phase, each func(*workflowView)) error {
	cont := ""
	for {
		page := &workflowViewList{}
		err := w.reader.List(ctx, page, client.InNamespace(namespace), client.MatchingLabels{argo.LabelPhase: string(phase)},
			client.Limit(w.page), client.Continue(cont))
		if err != nil {
			return fmt.Errorf("listing the %s workflows of namespace %q: %w", phase, namespace, err)
		}
		for i := range page.Items {
			each(&page.Items[i])
		}
		if cont = page.Continue; cont == "" {
			return nil
		}
	}
}

// runningHolds counts, by lock, the holds the Running workflows of namespace declare in their
// status (status.synchronization.mutex.holding[].mutex, .semaphore.holding[].holders: one per
// holder). Read only once a waiter has been suspected for StuckAfter, so rarely.
func (w *Watcher) runningHolds(ctx context.Context, namespace string) (map[string]int, error) {
	holds := map[string]int{}
	err := w.list(ctx, namespace, argo.PhaseRunning, func(v *workflowView) {
		for _, e := range v.Status.Synchronization.Mutex.Holding {
			if e.Mutex != "" {
				holds[e.Mutex]++
			}
		}
		for _, e := range v.Status.Synchronization.Semaphore.Holding {
			if e.Semaphore == "" {
				continue
			}
			if e.Holders != nil {
				holds[e.Semaphore] += len(e.Holders)
			} else {
				holds[e.Semaphore]++
			}
		}
	})
	if err != nil {
		return nil, err
	}
	return holds, nil
}

// declaredLocks are the keys of the workflow-level locks v's spec names (mutex, mutexes,
// semaphore, semaphores), as Argo's controller keys them: <namespace>/Mutex/<name> and
// <namespace>/ConfigMap/<name>/<key>.
func declaredLocks(v *workflowView) []string {
	var locks []string
	one := func(r *lockRef, semaphore bool) {
		ns := r.Namespace
		if ns == "" {
			ns = v.Namespace
		}
		switch {
		case !semaphore && r.Name != "":
			locks = append(locks, ns+"/Mutex/"+r.Name)
		case semaphore && r.ConfigMapKeyRef != nil && r.ConfigMapKeyRef.Name != "" && r.ConfigMapKeyRef.Key != "":
			locks = append(locks, ns+"/ConfigMap/"+r.ConfigMapKeyRef.Name+"/"+r.ConfigMapKeyRef.Key)
		}
	}
	sync := &v.Spec.Synchronization
	if sync.Mutex != nil {
		one(sync.Mutex, false)
	}
	for i := range sync.Mutexes {
		one(&sync.Mutexes[i], false)
	}
	if sync.Semaphore != nil {
		one(sync.Semaphore, true)
	}
	for i := range sync.Semaphores {
		one(&sync.Semaphores[i], true)
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
func waiterOf(v *workflowView) (waiter, bool) {
	m := waitMessage.FindStringSubmatch(v.Status.Message)
	if m == nil {
		return waiter{}, false
	}
	free, _ := strconv.Atoi(m[2])
	limit, _ := strconv.Atoi(m[3])
	wt := waiter{uid: v.UID, namespace: v.Namespace, name: v.Name, lock: m[1], free: free, limit: limit}
	// status.synchronization.mutex.waiting[].holder; .semaphore.waiting[].holders[].
	for _, e := range v.Status.Synchronization.Mutex.Waiting {
		if e.Mutex == wt.lock && e.Holder != "" {
			wt.holders = append(wt.holders, e.Holder)
		}
	}
	for _, e := range v.Status.Synchronization.Semaphore.Waiting {
		if e.Semaphore == wt.lock {
			wt.holders = append(wt.holders, e.Holders...)
		}
	}
	return wt, true
}
