package webhook

import (
	"crypto/sha256"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

const (
	// createMemory is how long the guard remembers a TaskSet create it admitted: Argo sends
	// the patch that follows an AlreadyExists within the same pass, milliseconds later.
	createMemory = 10 * time.Second
	// maxCreatesRemembered bounds the memory: past it, a create is not remembered (its patch,
	// if one comes, is judged by the node tree alone).
	maxCreatesRemembered = 10000
)

// createdTaskSet is a TaskSet create the guard admitted: by which workflow, with which tasks
// (the digest of each task's template).
type createdTaskSet struct {
	owner types.UID
	tasks map[string][sha256.Size]byte
	at    time.Time
}

// taskSetCreates remembers, by namespace and name, the last TaskSet create the guard admitted
// for a running workflow, for createMemory. Argo creates a workflow's TaskSet and, on
// AlreadyExists, patches the existing object with the same tasks: when a workflow reused the
// name of a deleted one whose TaskSet the garbage collector has not removed yet, that patch
// keeps the deleted workflow's owner reference, and this memory is how the guard knows the
// running workflow sent it (row T6): the same tasks with the same templates. A stale copy of
// the deleted workflow cannot put itself here (its create names the deleted workflow and is
// refused), and its patch, should its create have been admitted unverified, carries its own
// rendered templates.
type taskSetCreates struct {
	now func() time.Time

	mu sync.Mutex
	m  map[types.NamespacedName]createdTaskSet
}

func newTaskSetCreates(now func() time.Time) *taskSetCreates {
	return &taskSetCreates{now: now, m: map[types.NamespacedName]createdTaskSet{}}
}

// note remembers an admitted create of the TaskSet key by owner with tasks (digests of their
// templates by task key).
func (c *taskSetCreates) note(key types.NamespacedName, owner types.UID, tasks map[string][sha256.Size]byte) {
	if len(tasks) == 0 {
		return
	}
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; !ok && len(c.m) >= maxCreatesRemembered {
		for k, v := range c.m {
			if now.Sub(v.at) > createMemory {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCreatesRemembered {
			return
		}
	}
	c.m[key] = createdTaskSet{owner: owner, tasks: tasks, at: now}
}

// covers says whether, within createMemory, owner created the TaskSet key with every one of
// tasks (and at least one), each with the same template.
func (c *taskSetCreates) covers(key types.NamespacedName, owner types.UID, tasks map[string][sha256.Size]byte) bool {
	if len(tasks) == 0 || owner == "" {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.m[key]
	if !ok || v.owner != owner || c.now().Sub(v.at) > createMemory {
		return false
	}
	for t, digest := range tasks {
		if had, ok := v.tasks[t]; !ok || had != digest {
			return false
		}
	}
	return true
}
