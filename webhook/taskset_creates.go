package webhook

import (
	"crypto/sha256"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

const (
	// createMemory is how long the guard remembers a TaskSet create it admitted, for row T6:
	// Argo sends the patch that follows an AlreadyExists within the same pass, milliseconds
	// later.
	createMemory = 10 * time.Second
	// maxCreatesRemembered bounds the memory: full, it forgets what has expired, then the
	// oldest entry. To push out a create before the patch that follows it milliseconds later,
	// a flood would need this many admitted creates in those milliseconds; one that does
	// costs a read (row T7) or a requeue (row T6), not a notice.
	maxCreatesRemembered = 10000
	// maxCreatesBytes bounds the memory by what it holds (createCost), whatever any tenant who
	// may create WorkflowTaskSets sends: full, it forgets the oldest entries.
	maxCreatesBytes = 16 << 20
	// maxCreateBytes: a create that would cost more is not remembered (about 7,500 tasks; the
	// agent's TaskSet holds the HTTP and plugin nodes pending at once). Its repeat is read live
	// (row T7) and the patch after its AlreadyExists requeued (row T6): a delay, not a notice.
	maxCreateBytes = 1 << 20
	// taskCost is what one remembered task costs beside its key: its digest, the key's string
	// header, its allocation and the map's share (measured: 90 to 135 bytes a task of 6-byte keys,
	// by the size of the map).
	taskCost = sha256.Size + 96
	// createOverhead is what an entry costs beside its tasks.
	createOverhead = 256
)

// createCost is what the memory holds for a create by requester with tasks.
func createCost(requester string, tasks map[string][sha256.Size]byte) int {
	n := createOverhead + len(requester)
	for k := range tasks {
		n += len(k) + taskCost
	}
	return n
}

// createdTaskSet is a TaskSet create the guard admitted: by which workflow, sent by which user
// (request.userInfo.username), with which tasks (the digest of each task's template), when it
// was received, and whether a live read found the workflow running (row 5), rather than the
// store (rows 13 and 17).
type createdTaskSet struct {
	owner     types.UID
	requester string
	tasks     map[string][sha256.Size]byte
	at        time.Time
	live      bool
	// cost is createCost's, and seq the entry's place in taskSetCreates.order.
	cost int
	seq  uint64
}

// notedCreate is an entry of taskSetCreates.order: the key noted, and which noting of it.
type notedCreate struct {
	key types.NamespacedName
	seq uint64
}

// taskSetCreates remembers, by namespace and name, the last TaskSet create the guard admitted
// for a running workflow. Argo sends that create again on each pass while a node of the
// TaskSet is pending, and it fails with AlreadyExists: a create that repeats one admitted
// after a live read, less than its repeatMemory ago, is admitted without a read (row T7). On
// AlreadyExists, Argo patches the existing object with the same tasks: when a workflow reused
// the name of a deleted one whose TaskSet the garbage collector has not removed yet, that
// patch keeps the deleted workflow's owner reference, and this memory is how the guard knows
// the running workflow sent it (row T6): the same tasks with the same templates, sent by the
// same user, less than createMemory ago. A stale copy of the deleted workflow cannot put itself
// here (its create names the deleted workflow, is read and refused), and its patch, should its
// create have been admitted unverified, carries its own rendered templates. Another user's
// create (any tenant who may create TaskSets in the namespace: the API server calls validating
// webhooks before it finds that the object exists) vouches only for that user's own writes,
// never for Argo's. A refusal for the same workflow and name forgets what was remembered
// (forget).
type taskSetCreates struct {
	now func() time.Time
	// repeatMemory is how long a create admitted after a live read lets the same create
	// again in without one (row T7, Options.TaskSetRepeatsFor; negative: never): Argo sends
	// it on each pass while a node of the TaskSet is pending, a second or so apart when the
	// agent's results wake the workflow. Shorter than createMemory, so that a create T7
	// admits is still remembered for the patch after it; a TaskSet pending longer is read
	// again once in each repeatMemory.
	repeatMemory time.Duration

	mu sync.Mutex
	m  map[types.NamespacedName]createdTaskSet
	// order holds the notings in the order made (an entry noted again, or forgotten, leaves
	// its earlier ones behind, skipped when reached); bytes is the cost of what m holds; seq
	// numbers the notings.
	order []notedCreate
	bytes int
	seq   uint64
}

func newTaskSetCreates(now func() time.Time, repeatMemory time.Duration) *taskSetCreates {
	return &taskSetCreates{now: now, repeatMemory: repeatMemory, m: map[types.NamespacedName]createdTaskSet{}}
}

// note remembers an admitted create of the TaskSet key by owner, sent by requester, with tasks
// (digests of their templates by task key), received at at (now when zero); live says a live
// read found the workflow running.
func (c *taskSetCreates) note(key types.NamespacedName, owner types.UID, requester string, tasks map[string][sha256.Size]byte, at time.Time, live bool) {
	if len(tasks) == 0 {
		return
	}
	now := c.now()
	at = noteAt(at, now)
	cost := createCost(requester, tasks)
	c.mu.Lock()
	defer c.mu.Unlock()
	// What has expired goes first, whatever else: the memory holds only the last createMemory.
	c.expire(now)
	// This create replaces what was remembered of the key, remembered or not.
	c.drop(key)
	if cost > maxCreateBytes {
		return
	}
	for len(c.order) > 0 && (len(c.m) >= maxCreatesRemembered || c.bytes+cost > maxCreatesBytes) {
		c.dropOldest()
	}
	c.seq++
	c.m[key] = createdTaskSet{owner: owner, requester: requester, tasks: tasks, at: at, live: live, cost: cost, seq: c.seq}
	c.bytes += cost
	c.order = append(c.order, notedCreate{key, c.seq})
	if len(c.order) > 2*len(c.m)+64 {
		// Mostly notings left behind: keep the live ones, in order.
		kept := c.order[:0]
		for _, n := range c.order {
			if v, ok := c.m[n.key]; ok && v.seq == n.seq {
				kept = append(kept, n)
			}
		}
		c.order = kept
	}
}

// expire forgets the entries noted more than createMemory before now; c.mu is held.
func (c *taskSetCreates) expire(now time.Time) {
	for len(c.order) > 0 {
		n := c.order[0]
		v, ok := c.m[n.key]
		if ok && v.seq == n.seq && now.Sub(v.at) <= createMemory {
			return
		}
		if ok && v.seq == n.seq {
			c.drop(n.key)
		}
		c.order = c.order[1:]
	}
}

// dropOldest forgets the entry noted longest ago; c.mu is held and the memory not empty.
func (c *taskSetCreates) dropOldest() {
	for len(c.order) > 0 {
		n := c.order[0]
		c.order = c.order[1:]
		if v, ok := c.m[n.key]; ok && v.seq == n.seq {
			c.drop(n.key)
			return
		}
	}
}

// drop forgets the entry of key; c.mu is held.
func (c *taskSetCreates) drop(key types.NamespacedName) {
	if v, ok := c.m[key]; ok {
		c.bytes -= v.cost
		delete(c.m, key)
	}
}

// forget drops what is remembered of the TaskSet key, if owner created it.
func (c *taskSetCreates) forget(key types.NamespacedName, owner types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := c.m[key]; ok && v.owner == owner {
		c.drop(key)
	}
}

// covers says whether, within createMemory, owner created the TaskSet key with every one of
// tasks (and at least one), each with the same template, in a create sent by requester (row T6).
func (c *taskSetCreates) covers(key types.NamespacedName, owner types.UID, requester string, tasks map[string][sha256.Size]byte) bool {
	return c.matches(key, owner, requester, tasks, createMemory, false)
}

// repeats says whether, within repeatMemory, owner created the TaskSet key with every one of
// tasks (and at least one), each with the same template, in a create sent by requester and
// admitted after a live read (row T7).
func (c *taskSetCreates) repeats(key types.NamespacedName, owner types.UID, requester string, tasks map[string][sha256.Size]byte) bool {
	return c.repeatMemory > 0 && c.matches(key, owner, requester, tasks, c.repeatMemory, true)
}

func (c *taskSetCreates) matches(key types.NamespacedName, owner types.UID, requester string, tasks map[string][sha256.Size]byte, within time.Duration, live bool) bool {
	if len(tasks) == 0 || owner == "" {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[key]
	if !ok || v.owner != owner || v.requester != requester || c.now().Sub(v.at) > within || live && !v.live {
		return false
	}
	for t, digest := range tasks {
		if had, ok := v.tasks[t]; !ok || had != digest {
			return false
		}
	}
	return true
}

// noteAt is when a request received at at is remembered as received: at, or now when at is
// unset or ahead of now.
func noteAt(at, now time.Time) time.Time {
	if at.IsZero() || at.After(now) {
		return now
	}
	return at
}

// makeRoom makes room in m, a memory of at most limit workflows or TaskSets, for one more: when
// it is full, it forgets every entry last seen more than window before now and, if it is still
// full, the one seen longest ago. last gives when an entry was last seen.
func makeRoom[V any](m map[types.NamespacedName]V, limit int, now time.Time, window time.Duration, last func(V) time.Time) {
	if len(m) < limit {
		return
	}
	var oldest types.NamespacedName
	var oldestAt time.Time
	for k, v := range m {
		if at := last(v); now.Sub(at) > window {
			delete(m, k)
		} else if oldestAt.IsZero() || at.Before(oldestAt) {
			oldest, oldestAt = k, at
		}
	}
	if len(m) >= limit {
		delete(m, oldest)
	}
}
