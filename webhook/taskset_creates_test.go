package webhook

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// The memory of admitted TaskSet creates answers for the owner, requester and tasks it holds,
// within createMemory, and stays bounded: full, it forgets what has expired, then the oldest
// entry, so that a flood of creates cannot keep a new one out.
func TestTaskSetCreatesRemembersBoundedAndBriefly(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newTaskSetCreates(func() time.Time { return now }, DefaultOptions().TaskSetRepeatsFor)
	key := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "argo", Name: fmt.Sprint("wf-", i)}
	}
	digests := func(tasks ...string) map[string][sha256.Size]byte {
		m := map[string][sha256.Size]byte{}
		for _, t := range tasks {
			m[t] = sha256.Sum256([]byte("template of " + t))
		}
		return m
	}
	c.note(key(0), "uid-a", "argo", digests("t1", "t2"), time.Time{}, true)
	otherTemplate := digests("t1")
	otherTemplate["t1"] = sha256.Sum256([]byte("another template"))
	for _, tc := range []struct {
		name      string
		owner     types.UID
		requester string
		tasks     map[string][sha256.Size]byte
		want      bool
	}{
		{"the owner, a task it created", "uid-a", "argo", digests("t1"), true},
		{"the owner, every task it created", "uid-a", "argo", digests("t2", "t1"), true},
		{"the owner, a task it did not create", "uid-a", "argo", digests("t1", "t3"), false},
		{"the owner, a task it created with another template", "uid-a", "argo", otherTemplate, false},
		{"another owner", "uid-b", "argo", digests("t1"), false},
		{"the owner, a task it created, sent by another user", "uid-a", "mallory", digests("t1"), false},
		{"no task", "uid-a", "argo", nil, false},
	} {
		if got := c.covers(key(0), tc.owner, tc.requester, tc.tasks); got != tc.want {
			t.Errorf("%s: covers = %v, want %v", tc.name, got, tc.want)
		}
	}
	now = now.Add(createMemory + time.Millisecond)
	if c.covers(key(0), "uid-a", "argo", digests("t1")) {
		t.Error("a create older than createMemory still covers")
	}
	// Full of expired entries: a new create purges them.
	for i := 1; i < maxCreatesRemembered; i++ {
		c.note(key(i), "uid-a", "argo", digests("t"), time.Time{}, true)
	}
	now = now.Add(createMemory + time.Millisecond)
	c.note(key(maxCreatesRemembered), "uid-a", "argo", digests("t"), time.Time{}, true)
	if len(c.m) != 1 || !c.covers(key(maxCreatesRemembered), "uid-a", "argo", digests("t")) {
		t.Errorf("after the purge the memory holds %d entries, want the new one alone", len(c.m))
	}
	// Full of fresh entries (a flood of creates): a new one is remembered, and the oldest
	// entry forgotten, so that no flood keeps Argo's create from its patch a moment later.
	for i := range maxCreatesRemembered - 1 {
		now = now.Add(time.Microsecond)
		c.note(key(i), "uid-a", "flood", digests("t"), time.Time{}, true)
	}
	now = now.Add(time.Microsecond)
	c.note(key(-1), "uid-a", "argo", digests("t"), time.Time{}, true)
	if len(c.m) != maxCreatesRemembered || !c.covers(key(-1), "uid-a", "argo", digests("t")) {
		t.Errorf("full of fresh entries, the memory holds %d (want %d) and covers the new one: %v (want true)", len(c.m), maxCreatesRemembered, c.covers(key(-1), "uid-a", "argo", digests("t")))
	}
	if c.covers(key(maxCreatesRemembered), "uid-a", "argo", digests("t")) || !c.covers(key(0), "uid-a", "flood", digests("t")) {
		t.Error("full of fresh entries, the memory forgot another entry than the oldest")
	}
}

// Row T7 trusts only a create admitted after a live read, for --taskset-repeats-for from when it was
// received; row T6 any admitted create, for createMemory. A refusal for the owner forgets it.
func TestTaskSetCreatesRepeatsOnlyLiveAndBriefly(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newTaskSetCreates(func() time.Time { return now }, DefaultOptions().TaskSetRepeatsFor)
	key := types.NamespacedName{Namespace: "argo", Name: "wf"}
	tasks := map[string][sha256.Size]byte{"t1": sha256.Sum256([]byte("template"))}

	c.note(key, "uid-a", "argo", tasks, time.Time{}, false)
	if c.repeats(key, "uid-a", "argo", tasks) || !c.covers(key, "uid-a", "argo", tasks) {
		t.Errorf("a create admitted from the store: repeats %v (want false), covers %v (want true)", c.repeats(key, "uid-a", "argo", tasks), c.covers(key, "uid-a", "argo", tasks))
	}
	// Received 3 s before it was remembered (the decision took that long): counted from then.
	c.note(key, "uid-a", "argo", tasks, now.Add(-3*time.Second), true)
	if !c.repeats(key, "uid-a", "argo", tasks) || c.repeats(key, "uid-b", "argo", tasks) {
		t.Error("a create admitted after a live read: want repeats for its owner alone")
	}
	now = now.Add(DefaultOptions().TaskSetRepeatsFor - 3*time.Second + time.Millisecond)
	if c.repeats(key, "uid-a", "argo", tasks) || !c.covers(key, "uid-a", "argo", tasks) {
		t.Errorf("past the repeat window from its receipt: repeats %v (want false), covers %v (want true)", c.repeats(key, "uid-a", "argo", tasks), c.covers(key, "uid-a", "argo", tasks))
	}
	c.note(key, "uid-a", "argo", tasks, time.Time{}, true)
	c.forget(key, "uid-b")
	if !c.repeats(key, "uid-a", "argo", tasks) {
		t.Error("a refusal for another workflow forgot this one's create")
	}
	c.forget(key, "uid-a")
	if c.repeats(key, "uid-a", "argo", tasks) || c.covers(key, "uid-a", "argo", tasks) {
		t.Error("a refusal for the owner left its create remembered")
	}
}

// A create and the merge patch after it carry the same template but for the nulls the API
// server drops from a patch's new keys: the same digest. Another value, another digest.
func TestTemplateDigestIgnoresNullsOnly(t *testing.T) {
	create := []byte(`{"name":"notify","http":{"url":"http://x","timeoutSeconds":null,"headers":[{"name":"a","value":"b"}]},"metrics":{"prometheus":[{"gauge":{"realtime":null,"value":"1"}}]}}`)
	patch := []byte(`{"http":{"headers":[{"value":"b","name":"a"}],"url":"http://x"},"metrics":{"prometheus":[{"gauge":{"value":"1"}}]},"name":"notify"}`)
	other := []byte(`{"name":"notify","http":{"url":"http://y","headers":[{"name":"a","value":"b"}]},"metrics":{"prometheus":[{"gauge":{"value":"1"}}]}}`)
	if templateDigest(create) != templateDigest(patch) {
		t.Error("the create's template and the patch's (nulls dropped, keys reordered) digest apart")
	}
	if templateDigest(create) == templateDigest(other) {
		t.Error("templates with another URL digest alike")
	}
	if templateDigest([]byte(`{`)) != sha256.Sum256([]byte(`{`)) {
		t.Error("a template that does not decode is not digested as it came")
	}
}

// Row T7's window may not outlast the memory of admitted creates that row T6 reads.
func TestTaskSetRepeatsForIsBoundedByTheMemory(t *testing.T) {
	store := storeFor(t, tableWorkflow, storeEmpty, false)
	if _, err := newGuard(nil, store, Options{TaskSetRepeatsFor: createMemory + time.Second}); err == nil {
		t.Errorf("--taskset-repeats-for %s past the %s memory was accepted", createMemory+time.Second, createMemory)
	}
	if _, err := newGuard(nil, store, Options{TaskSetRepeatsFor: createMemory}); err != nil {
		t.Errorf("--taskset-repeats-for %s: %v", createMemory, err)
	}
}

// The memory is bounded by what it holds, not only by its count: a create that would cost more
// than maxCreateBytes is not remembered (and forgets the key's earlier one), creates past
// maxCreatesBytes in all push out the oldest, and every note forgets what has expired, so that
// no create is held past createMemory however few come after it.
func TestTaskSetCreatesAreBoundedByBytes(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newTaskSetCreates(func() time.Time { return now }, DefaultOptions().TaskSetRepeatsFor)
	key := func(i int) types.NamespacedName {
		return types.NamespacedName{Namespace: "argo", Name: fmt.Sprint("wf-", i)}
	}
	tasks := func(n int) map[string][sha256.Size]byte {
		m := make(map[string][sha256.Size]byte, n)
		for i := range n {
			m[fmt.Sprint("task-", i)] = sha256.Sum256([]byte(fmt.Sprint("template ", i)))
		}
		return m
	}
	small := tasks(2)
	c.note(key(0), "uid-a", "argo", small, time.Time{}, true)
	huge := tasks(80000)
	if cost := createCost("argo", huge); cost <= maxCreateBytes {
		t.Fatalf("a create of 80,000 tasks costs %d, not above maxCreateBytes %d: the case proves nothing", cost, maxCreateBytes)
	}
	c.note(key(0), "uid-a", "argo", huge, time.Time{}, true)
	if len(c.m) != 0 || c.bytes != 0 || c.covers(key(0), "uid-a", "argo", small) {
		t.Errorf("after a create too large to remember: %d entries, %d bytes, the earlier create still covers: %v; want nothing held", len(c.m), c.bytes, c.covers(key(0), "uid-a", "argo", small))
	}
	// Creates just under the per-create bound fill the memory to its byte bound and no further.
	big := tasks(7000)
	cost := createCost("argo", big)
	if cost > maxCreateBytes {
		t.Fatalf("a create of 7,000 tasks costs %d, above maxCreateBytes", cost)
	}
	n := 3 * maxCreatesBytes / cost
	for i := range n {
		now = now.Add(time.Millisecond)
		c.note(key(i), "uid-a", "flood", big, time.Time{}, true)
		if c.bytes > maxCreatesBytes {
			t.Fatalf("after %d creates of %d bytes the memory holds %d bytes, past its bound %d", i+1, cost, c.bytes, maxCreatesBytes)
		}
	}
	if !c.covers(key(n-1), "uid-a", "flood", big) || c.covers(key(0), "uid-a", "flood", big) {
		t.Error("full by bytes, the memory did not keep the newest create and forget the oldest")
	}
	// One note after createMemory forgets everything older: nothing waits for a full memory.
	now = now.Add(createMemory + time.Millisecond)
	c.note(key(-1), "uid-a", "argo", small, time.Time{}, true)
	if len(c.m) != 1 || c.bytes != createCost("argo", small) {
		t.Errorf("a note after createMemory left %d entries, %d bytes; want the new one alone (%d bytes)", len(c.m), c.bytes, createCost("argo", small))
	}
	if len(c.order) > 2*len(c.m)+64 {
		t.Errorf("the notings' order holds %d for %d entries: it grows without bound", len(c.order), len(c.m))
	}
}
