//go:build envtest

package webhook

import (
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// warnings collects the admission warnings a client receives.
type warnings struct {
	mu   sync.Mutex
	seen []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen = append(w.seen, text)
}

func (w *warnings) all() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.seen, "\n")
}

// warningClient is a client whose admission warnings w collects.
func warningClient(t *testing.T, w *warnings) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.WarningHandler = w
	c, err := client.New(cfg, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}
