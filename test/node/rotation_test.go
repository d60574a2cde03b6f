//go:build node

package node_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// agreement samples, every 100 ms, whether each ready replica's served certificate verifies
// against the caBundle the API server holds for the webhook: the time they disagree is the
// time the API server cannot call that replica (it fails open).
type agreement struct {
	mu       sync.Mutex
	c        certCounts
	badSince time.Time
	cancel   context.CancelFunc
	done     chan struct{}
}

// certCounts is what the samples found.
type certCounts struct {
	samples   int
	bad       int
	longest   time.Duration
	served    map[string]bool // fingerprints of the certificates the replicas served
	lastError string
}

func (c certCounts) String() string {
	return fmt.Sprintf("%d samples, %d with a replica whose certificate the caBundle does not verify (longest run %s), %d serving certificates seen",
		c.samples, c.bad, c.longest.Round(time.Millisecond), len(c.served))
}

func startAgreement(t *testing.T) *agreement {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	a := &agreement{c: certCounts{served: map[string]bool{}}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for ctx.Err() == nil {
			a.sample(ctx)
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { a.stop() })
	return a
}

func (a *agreement) sample(ctx context.Context) {
	var vwc admissionregistrationv1.ValidatingWebhookConfiguration
	if err := env.Client.Get(ctx, client.ObjectKey{Name: deploy}, &vwc); err != nil || len(vwc.Webhooks) == 0 {
		return
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(vwc.Webhooks[0].ClientConfig.CABundle)
	var pods corev1.PodList
	if err := env.Client.List(ctx, &pods, client.InNamespace(releaseNS)); err != nil {
		return
	}
	bad, why := false, ""
	for _, p := range pods.Items {
		if !podReady(&p) || p.DeletionTimestamp != nil || p.Status.PodIP == "" || !strings.HasPrefix(p.Name, deploy+"-") || strings.HasSuffix(p.Name, "-check") {
			continue
		}
		addr := net.JoinHostPort(p.Status.PodIP, "9443")
		d := &net.Dialer{Timeout: 2 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // G402: read the certificate, verified below
		if err != nil {
			continue // not serving: not a disagreement
		}
		certs := conn.ConnectionState().PeerCertificates
		_ = conn.Close()
		if len(certs) == 0 {
			continue
		}
		sum := sha256.Sum256(certs[0].Raw)
		inter := x509.NewCertPool()
		for _, c := range certs[1:] {
			inter.AddCert(c)
		}
		_, verr := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: deploy + "-webhook." + releaseNS + ".svc"})
		a.mu.Lock()
		a.c.served[hex.EncodeToString(sum[:8])] = true
		a.mu.Unlock()
		if verr != nil {
			bad, why = true, fmt.Sprintf("%s: %v", p.Name, verr)
		}
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.c.samples++
	if bad {
		a.c.bad++
		a.c.lastError = why
		if a.badSince.IsZero() {
			a.badSince = now
		}
		a.c.longest = max(a.c.longest, now.Sub(a.badSince))
	} else {
		a.badSince = time.Time{}
	}
}

func (a *agreement) stop() certCounts {
	a.cancel()
	<-a.done
	return a.snapshot()
}

// secretCert says what the certificate Secret holds now, and the arguments the guard runs with.
func secretCert(t *testing.T) string {
	t.Helper()
	var secret corev1.Secret
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: deploy + "-webhook-tls"}, &secret); err != nil {
		return err.Error()
	}
	var d appsv1.Deployment
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: deploy}, &d); err != nil {
		return err.Error()
	}
	out := fmt.Sprintf("the guard's arguments: %v\n", d.Spec.Template.Spec.Containers[0].Args)
	if b, _ := pem.Decode(secret.Data["tls.crt"]); b != nil {
		if c, err := x509.ParseCertificate(b.Bytes); err == nil {
			out += fmt.Sprintf("the Secret's certificate: valid %s to %s (now %s)", c.NotBefore.Format(time.TimeOnly), c.NotAfter.Format(time.RFC3339), time.Now().Format(time.RFC3339))
		}
	}
	return out
}

// upgrade runs helm upgrade --wait of the release with nodeValues and set.
func upgrade(t *testing.T, set ...string) {
	t.Helper()
	args := append([]string{"upgrade", release, filepath.Join(testenv.RepoRoot(), "charts", "exit-guard"),
		"--namespace", releaseNS, "--wait", "--timeout", "4m"}, nodeValues()...)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	mustHelm(t, args...)
	waitAvailable(t, 2)
	// The old replicas may still run (their shutdown delay) and act on the Secret with the old
	// settings: wait until they are gone.
	err := wait.PollUntilContextTimeout(t.Context(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := env.Client.List(ctx, &pods, client.InNamespace(releaseNS)); err != nil {
			return false, err
		}
		n := 0
		for _, p := range pods.Items {
			if c := metav1.GetControllerOf(&p); c != nil && c.Kind == "ReplicaSet" {
				n++
			}
		}
		return n == 2, nil
	})
	if err != nil {
		t.Fatalf("the old replicas did not go: %v", err)
	}
}

// reset starts the counts again (the certificates seen too), the sampling going on.
func (a *agreement) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.c, a.badSince = certCounts{served: map[string]bool{}}, time.Time{}
}

// snapshot copies the counts.
func (a *agreement) snapshot() certCounts {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.c
	c.served = maps.Clone(a.c.served)
	return c
}

// agreed waits until a sample finds every ready replica's certificate verified by the
// caBundle again, after a disagreement, and returns how long that took from since.
func (a *agreement) agreed(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	err := wait.PollUntilContextTimeout(t.Context(), 100*time.Millisecond, 5*time.Minute, true, func(context.Context) (bool, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.c.bad > 0 && a.badSince.IsZero(), nil
	})
	if err != nil {
		t.Fatalf("the caBundle and the replicas' certificates did not agree again: %s", a.snapshot().String())
	}
	return time.Since(since)
}

// TestSelfCertificatesOnTheNode, in certificates.mode=self (the default), under a steady stream
// of pod creates, samples every 100 ms whether each ready replica's served certificate verifies
// against the caBundle the API server holds:
//   - a new CA (the Secret emptied, as to rotate it by hand; the guard also makes one when its
//     CA nears the end of its ten years): the guard writes the new CA alone into the caBundle
//     at once, and each replica serves its old certificate until the kubelet refreshes its
//     Secret volume. That window is measured and reported, with the stale exit handlers left
//     unjudged in it: it is not yet 0, and the test does not pretend it is;
//   - renewals under the same CA, every 30 s (a serving certificate of 3 minutes, renewed 2.5
//     minutes before it expires): the two agree at every sample, none is unjudged.
func TestSelfCertificatesOnTheNode(t *testing.T) {
	installChart(t)
	upgrade(t, "certificates.self.serverCertDuration=3m", "certificates.self.lookahead=150s", "certificates.self.checkFrequency=5s")
	defer upgrade(t)
	p := startProber(t, newNamespace(t), 100*time.Millisecond)
	a := startAgreement(t)

	var secret corev1.Secret
	if err := env.Client.Get(t.Context(), client.ObjectKey{Namespace: releaseNS, Name: deploy + "-webhook-tls"}, &secret); err != nil {
		t.Fatal(err)
	}
	before := p.snapshot()
	emptied := time.Now()
	patch := client.MergeFrom(secret.DeepCopy())
	secret.Data = map[string][]byte{}
	if err := env.Client.Patch(t.Context(), &secret, patch); err != nil {
		t.Fatal(err)
	}
	window := a.agreed(t, emptied)
	newCA, during := a.snapshot(), p.snapshot()
	unjudged := during.Unjudged - before.Unjudged
	t.Logf("a new CA: the caBundle and the replicas disagreed for %s (longest run of samples), agreed again %s after the Secret was emptied; %d of %d stale exit handlers unjudged meanwhile",
		newCA.longest.Round(time.Millisecond), window.Round(time.Millisecond), unjudged, unjudged+during.Refused-before.Refused)

	a.reset()
	renewalsFrom := p.snapshot()
	err := wait.PollUntilContextTimeout(t.Context(), time.Second, 150*time.Second, false, func(context.Context) (bool, error) {
		return len(a.snapshot().served) >= 4, nil
	})
	renewals, got := a.stop(), p.stop()
	t.Logf("renewals under the same CA: %s; stale exit handlers: %d refused, %d unjudged", renewals,
		got.Refused-renewalsFrom.Refused, got.Unjudged-renewalsFrom.Unjudged)
	if err != nil {
		t.Fatalf("fewer than 4 serving certificates reached the replicas in 150 s: %s\n%s%s", renewals, secretCert(t), guardLogs(t))
	}
	if renewals.bad != 0 {
		t.Errorf("a renewal under the same CA left a replica's certificate unverified: %s; last: %s", renewals, renewals.lastError)
	}
	if got.Unjudged != renewalsFrom.Unjudged || got.Failed != 0 {
		t.Errorf("during renewals: %s\n%s", got, strings.Join(got.Errors, "\n"))
	}
}
