package testenv

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Namespace creates a namespace named prefix and a random suffix, with labels, and returns its
// name.
func Namespace(t testing.TB, c client.Client, prefix string, labels map[string]string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: prefix + rand.String(8), Labels: labels}}
	if err := c.Create(t.Context(), ns); err != nil {
		t.Fatalf("creating namespace %s: %v", ns.Name, err)
	}
	return ns.Name
}

// EventsAbout names the Events a test looks for: in Namespace, about the object of UID (or,
// with no UID, of Name), with Reason ("" for any).
type EventsAbout struct {
	Namespace, Name string
	UID             types.UID
	Reason          string
}

// About is EventsAbout obj, of reason.
func About(obj client.Object, reason string) EventsAbout {
	return EventsAbout{Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: obj.GetUID(), Reason: reason}
}

func (a EventsAbout) match(e *eventsv1.Event) bool {
	if a.Reason != "" && e.Reason != a.Reason {
		return false
	}
	if a.UID != "" {
		return e.Regarding.UID == a.UID
	}
	return e.Regarding.Name == a.Name
}

// occurrences is how many times e happened: the guard's Events (events.k8s.io) fold repeats
// into a series, Argo's (core/v1, read here through events.k8s.io) into a count.
func occurrences(e *eventsv1.Event) int {
	n := max(1, int(e.DeprecatedCount))
	if e.Series != nil {
		n = max(n, int(e.Series.Count))
	}
	return n
}

// ListEvents lists the Events a names, read through events.k8s.io/v1 (the API server serves
// core/v1 Events there too).
func ListEvents(ctx context.Context, c client.Client, a EventsAbout) ([]eventsv1.Event, error) {
	var list eventsv1.EventList
	if err := c.List(ctx, &list, client.InNamespace(a.Namespace)); err != nil {
		return nil, err
	}
	var out []eventsv1.Event
	for i := range list.Items {
		if a.match(&list.Items[i]) {
			out = append(out, list.Items[i])
		}
	}
	return out, nil
}

// CountEvents counts the occurrences of the Events a names, failing t when they cannot be
// listed.
func CountEvents(ctx context.Context, t testing.TB, c client.Client, a EventsAbout) int {
	t.Helper()
	events, err := ListEvents(ctx, c, a)
	if err != nil {
		t.Fatalf("listing the Events of %s/%s: %v", a.Namespace, a.Name, err)
	}
	n := 0
	for i := range events {
		n += occurrences(&events[i])
	}
	return n
}

// WaitEvent polls for an Event a names, for up to 30 s, and returns the first found; it fails t
// when none comes.
func WaitEvent(t testing.TB, c client.Client, a EventsAbout) eventsv1.Event {
	t.Helper()
	var found eventsv1.Event
	err := wait.PollUntilContextTimeout(t.Context(), 50*time.Millisecond, 30*time.Second, true,
		func(ctx context.Context) (bool, error) {
			events, err := ListEvents(ctx, c, a)
			if err != nil || len(events) == 0 {
				return false, err
			}
			found = events[0]
			return true, nil
		})
	if err != nil {
		t.Fatalf("no %s Event about %s/%s: %v", a.Reason, a.Namespace, a.Name, err)
	}
	return found
}
