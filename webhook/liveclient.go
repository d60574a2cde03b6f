package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// The live client's connection settings. A live read has an attempt timeout of about a second
// and a budget of a few: a connection that stops answering must be given up within the
// budget, not after client-go's HTTP/2 health check (30 s of silence, then a 15 s ping).
const (
	// liveClientPingAfter: a connection that has received nothing for this long is pinged.
	// The API server answers pings whatever its load (they do not pass through fairness).
	liveClientPingAfter = 2 * time.Second
	// liveClientPingTimeout: a ping unanswered for this long closes the connection, failing the
	// requests on it at once (the live read retries on a new one).
	liveClientPingTimeout = time.Second
	// liveClientDialTimeout bounds a dial and a TLS handshake.
	liveClientDialTimeout = 2 * time.Second
	// liveClientRebuildAfter: the pool is built anew this often, reading the rest config's
	// files again (the CA bundle, a client certificate), so that a rotated CA or certificate
	// is taken up without a restart; a failed verification or a 401 rebuilds it at once.
	liveClientRebuildAfter = 5 * time.Minute
	// liveClientRebuildAtMost: a failure rebuilds the pool at most this often, so that a 401
	// that persists (a token revoked) does not cost a new connection per request.
	liveClientRebuildAtMost = 10 * time.Second
	// liveClientDrainAfter: the connections of a pool built anew that were busy at that moment
	// are closed this long after, once their requests (bounded by the live-read budget) are
	// done, rather than left to the idle timeout.
	liveClientDrainAfter = 10 * time.Second
)

// liveClient is how the guard reads workflows live, on connections of its own: not the watch's
// (the manager's client and cache share one HTTP/2 connection from one rest config: were it
// blackholed, every live read would wait with it).
//
//   - First attempts and retries share a pool whose HTTP/2 connections are pinged after 2 s of
//     silence and closed after a 1 s unanswered ping.
//   - A hedge (an attempt started because the one before it has not answered) dials a
//     connection of its own, used once: whatever hangs the pool's connection, the hedge does
//     not wait behind it. Hedges are bounded by maxExtraLiveReads.
//   - client-go's own retries are off (MaxRetries(0)): it would wait at least a second, inside
//     one attempt, after a 429 or a 5xx with Retry-After and after a reset connection. The
//     live read's own pauses (50 ms, doubling) and hedges take their place.
//
// It is a client.Reader of Workflows (Get) and of their metadata by name (List into a
// metav1.PartialObjectMetadataList), which is all that liveRead asks of it.
type liveClient struct {
	cfg   *rest.Config
	codec runtime.NegotiatedSerializer
	clock clock.WithDelayedExecution

	mu sync.Mutex
	// pool serves first attempts and retries; poolT is its transport, built at builtAt;
	// rebuild: the next request builds it anew (a failed TLS verification on it: a failed
	// handshake costs no kept connection); rebuildSoon: the first request liveClientRebuildAtMost
	// after it was built does (a 401).
	pool        *rest.RESTClient
	poolT       *http.Transport
	builtAt     time.Time
	rebuild     bool
	rebuildSoon bool
}

var _ client.Reader = (*liveClient)(nil)

// newLiveClient builds the live client from the manager's rest config; scheme must know
// argo.Workflow.
func newLiveClient(cfg *rest.Config, scheme *runtime.Scheme) (*liveClient, error) {
	cfg = rest.CopyConfig(cfg)
	gv := argo.WorkflowGVK.GroupVersion()
	cfg.GroupVersion = &gv
	cfg.APIPath = "/apis"
	cfg.ContentType = runtime.ContentTypeJSON
	p := &liveClient{cfg: cfg, codec: serializer.NewCodecFactory(scheme).WithoutConversion(), clock: clock.RealClock{}}
	cfg.NegotiatedSerializer = p.codec
	pool, t, err := p.client(false)
	if err != nil {
		return nil, fmt.Errorf("webhook: building the live client: %w", err)
	}
	p.pool, p.poolT, p.builtAt = pool, t, p.clock.Now()
	return p, nil
}

// pooled returns the pool, built anew when it is older than liveClientRebuildAfter or a
// request on it failed as a rotation would make it fail. The old transport's idle
// connections are closed; requests in flight on it finish. Should the rebuild fail (a file
// unreadable mid-rotation), the old pool serves and the next request tries again.
func (p *liveClient) pooled() *rest.RESTClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	age := p.clock.Since(p.builtAt)
	if age < liveClientRebuildAfter && !p.rebuild && (!p.rebuildSoon || age < liveClientRebuildAtMost) {
		return p.pool
	}
	pool, t, err := p.client(false)
	if err != nil {
		return p.pool
	}
	old := p.poolT
	p.pool, p.poolT, p.builtAt, p.rebuild, p.rebuildSoon = pool, t, p.clock.Now(), false, false
	old.CloseIdleConnections()
	p.clock.AfterFunc(liveClientDrainAfter, old.CloseIdleConnections)
	return p.pool
}

// noteFailure marks the pool for a rebuild when err says its credentials or its trust are
// out of date: the server's certificate not verified (a rotated CA: at once), or 401 (a
// rotated client certificate: at most every liveClientRebuildAtMost; a rotated token file is
// read again by client-go itself).
func (p *liveClient) noteFailure(err error) {
	var verify *tls.CertificateVerificationError
	var unknownCA x509.UnknownAuthorityError
	switch {
	case errors.As(err, &verify) || errors.As(err, &unknownCA):
		p.mu.Lock()
		p.rebuild = true
		p.mu.Unlock()
	case apierrors.IsUnauthorized(err):
		p.mu.Lock()
		p.rebuildSoon = true
		p.mu.Unlock()
	}
}

// client builds a REST client on a transport of its own, and returns the transport, whose
// idle connections the caller closes when it is done with a client used once (once: its
// connection is not kept alive, so that a hedge cancelled in flight, whose HTTP/2 stream ends
// after the caller is done, still closes its connection rather than leave it open, and pinged,
// until the idle timeout).
func (p *liveClient) client(once bool) (*rest.RESTClient, *http.Transport, error) {
	tlsConfig, err := rest.TLSConfigFor(p.cfg)
	if err != nil {
		return nil, nil, err
	}
	dial := (&net.Dialer{Timeout: liveClientDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	if p.cfg.Dial != nil {
		dial = p.cfg.Dial
	}
	proxy := http.ProxyFromEnvironment
	if p.cfg.Proxy != nil {
		proxy = p.cfg.Proxy
	}
	t := &http.Transport{
		Proxy:               proxy,
		DialContext:         dial,
		TLSClientConfig:     tlsConfig,
		TLSHandshakeTimeout: liveClientDialTimeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: maxExtraLiveReads,
		IdleConnTimeout:     90 * time.Second,
		DisableKeepAlives:   once,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:  liveClientPingAfter,
			PingTimeout:      liveClientPingTimeout,
			WriteByteTimeout: liveClientPingAfter,
		},
	}
	rt, err := rest.HTTPWrappersForConfig(p.cfg, t)
	if err != nil {
		return nil, nil, err
	}
	rc, err := rest.RESTClientForConfigAndClient(p.cfg, &http.Client{Transport: rt})
	if err != nil {
		return nil, nil, err
	}
	return rc, t, nil
}

// freshConnectionKey marks the context of an attempt that must not share a connection.
type freshConnectionKey struct{}

// onFreshConnection marks ctx: the live client serves it on a connection dialled for it alone.
func onFreshConnection(ctx context.Context) context.Context {
	return context.WithValue(ctx, freshConnectionKey{}, true)
}

// request starts a GET of the workflows of namespace on the pool, or, for a context marked by
// onFreshConnection, on a connection of its own; done releases that connection.
func (p *liveClient) request(ctx context.Context, namespace string) (r *rest.Request, done func(error), err error) {
	fresh, _ := ctx.Value(freshConnectionKey{}).(bool)
	if !fresh {
		return p.pooled().Get().MaxRetries(0).Namespace(namespace).Resource(argo.Resource), p.noteFailure, nil
	}
	rc, t, err := p.client(true)
	if err != nil {
		return nil, nil, err
	}
	done = func(err error) {
		t.CloseIdleConnections()
		p.noteFailure(err)
	}
	return rc.Get().MaxRetries(0).Namespace(namespace).Resource(argo.Resource), done, nil
}

// Get reads a whole Workflow: into an argo.Workflow (metadata and phase), an argo.WorkflowNodes
// (and the name, type and phase of each node), or an unstructured object.
func (p *liveClient) Get(ctx context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	switch obj.(type) {
	case *argo.Workflow, *argo.WorkflowNodes, *unstructured.Unstructured:
	default:
		return fmt.Errorf("webhook: the live client reads Workflows, not %T", obj)
	}
	r, done, err := p.request(ctx, key.Namespace)
	if err != nil {
		return err
	}
	res := r.Name(key.Name).Do(ctx)
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		var raw []byte
		if raw, err = res.Raw(); err == nil {
			err = o.UnmarshalJSON(raw)
		}
	case *argo.WorkflowNodes:
		var raw []byte
		if raw, err = res.Raw(); err == nil {
			err = json.Unmarshal(raw, o)
		}
	default:
		err = res.Into(o)
	}
	done(err)
	return err
}

// partialObjectMetadataList is the Accept header of a LIST of metadata only.
const partialObjectMetadataList = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"

// List reads the metadata of the Workflows of a namespace that match a field selector.
func (p *liveClient) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	l, ok := list.(*metav1.PartialObjectMetadataList)
	if !ok {
		return fmt.Errorf("webhook: the live client lists Workflow metadata, not %T", list)
	}
	lo := (&client.ListOptions{}).ApplyOptions(opts)
	if lo.LabelSelector != nil || lo.Limit != 0 || lo.Continue != "" || lo.Raw != nil {
		return errors.New("webhook: the live client lists by field selector only")
	}
	r, done, err := p.request(ctx, lo.Namespace)
	if err != nil {
		return err
	}
	r = r.SetHeader("Accept", partialObjectMetadataList)
	if lo.FieldSelector != nil {
		r = r.Param("fieldSelector", lo.FieldSelector.String())
	}
	raw, err := r.Do(ctx).Raw()
	done(err)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, l); err != nil {
		return fmt.Errorf("webhook: decoding the list of workflows: %w", err)
	}
	if l.Kind != "PartialObjectMetadataList" {
		return fmt.Errorf("webhook: the API server answered a list of metadata with %q", l.Kind)
	}
	return nil
}
