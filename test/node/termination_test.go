//go:build node

package node_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestGracefulTerminationAnswersWhatIsInFlight deletes one replica's pod (kubelet sends its
// container SIGTERM) while eight streams of pod creates keep requests in flight at every
// moment: none goes unjudged or fails. What holds it is the guard's drain (shutdownDelay, then
// the server's graceful shutdown) and, as much, the API server, which sends a webhook call
// that meets a closed or reset connection again: a guard broken on purpose to exit at once on
// SIGTERM, with shutdownDelay 0s, left none of 466 unjudged either. The test holds the
// outcome a user sees, whichever of the two gives it.
func TestGracefulTerminationAnswersWhatIsInFlight(t *testing.T) {
	installChart(t)
	waitAvailable(t, 2)
	victim := guardPods(t)[0]
	p := startProbers(t, newNamespace(t), 10*time.Millisecond, 8)
	start := time.Now()
	if err := env.Client.Delete(t.Context(), &victim); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(&victim), &corev1.Pod{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	if err != nil {
		t.Fatalf("pod %s did not go: %v", victim.Name, err)
	}
	gone := time.Since(start)
	waitReplaced(t, []corev1.Pod{victim})
	got := p.stop()
	t.Logf("a replica deleted under eight streams: gone after %s; %s", gone.Round(100*time.Millisecond), got)
	if got.Unjudged != 0 || got.Failed != 0 || got.Refused == 0 {
		t.Errorf("%s: want every stale exit handler refused and every step admitted\n%s", got, strings.Join(got.Errors, "\n"))
	}
}
