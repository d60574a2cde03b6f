//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/testenv"
)

// The corpus (make e2e-corpus): every Workflow of a folder that no one here wrote, by default
// Argo's own examples/ from the controller's module, submitted to a real controller in a
// random order, once without the guard and once with it (enforce mode, the chart's default
// coverage), each workflow's two runs compared; then, with E2E_CORPUS_STALE, the same with a
// stale pass forced on each workflow once it completed (the lagging watch of the proof, and
// podGC OnPodCompletion where the workflow sets no podGC), counting what the stale pass sent
// and what got through. The role Argo gives each pod (from the workflow's final status and its
// spec, corpusRoles) is held against the one the guard gave it (its audit annotation).
//
// Environment: E2E_CORPUS (the folder; empty: <module>/examples of each version),
// E2E_CORPUS_VERSIONS (comma-separated, default v3.4.17), E2E_CORPUS_PICK (comma-separated file
// names, relative to the folder, to run alone), E2E_CORPUS_STALE (1: the stale runs too),
// E2E_CORPUS_REPORT (a Markdown report written there), E2E_CORPUS_PODS (each pod the controller
// created in the guarded run, with Argo's role, written there as JSON), E2E_CORPUS_SEED (the
// order's seed; default the time), E2E_CORPUS_WAIT (how long the run waits for its workflows
// after the last is submitted; default 4m).

// corpusWorkflow is one document of the corpus: a Workflow to run, an object the workflows
// may need (support), or why it is neither.
type corpusWorkflow struct {
	key     string // file, and #n for the n-th document of a file of several
	obj     *unstructured.Unstructured
	support *unstructured.Unstructured
	skip    string
}

// supportKinds are the kinds of the corpus's other objects that its workflows use, created
// before them as a user would have them installed: the templates they reference and the
// ConfigMaps their parameters and semaphores read.
var supportKinds = map[string]bool{"WorkflowTemplate": true, "ClusterWorkflowTemplate": true, "ConfigMap": true}

var dnsUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// loadCorpus reads every YAML or JSON document under dir (pick, when not empty, names the
// files to read), and names each Workflow after its file, so that its two runs have the same
// node names.
func loadCorpus(dir string, pick []string) ([]corpusWorkflow, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		ext := filepath.Ext(path)
		if d.IsDir() || ext != ".yaml" && ext != ".yml" && ext != ".json" {
			return nil
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		if len(pick) == 0 || slices.Contains(pick, rel) {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	slices.Sort(files)
	var out []corpusWorkflow
	for i, rel := range files {
		raw, err := os.ReadFile(filepath.Join(dir, rel)) //nolint:gosec // G304: the corpus folder the user named
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for n := 0; ; n++ {
			key := rel
			if n > 0 {
				key = fmt.Sprintf("%s#%d", rel, n+1)
			}
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				out = append(out, corpusWorkflow{key: key, skip: "not a Kubernetes object the harness can read: " + err.Error()})
				break
			}
			if doc == nil {
				continue
			}
			obj := &unstructured.Unstructured{Object: doc}
			if supportKinds[obj.GetKind()] {
				if obj.GetKind() != "ClusterWorkflowTemplate" {
					obj.SetNamespace(namespace)
				}
				out = append(out, corpusWorkflow{key: key, support: obj})
				continue
			}
			if obj.GetKind() != argo.Kind || argo.GroupOf(obj.GetAPIVersion()) != argo.Group {
				out = append(out, corpusWorkflow{key: key, skip: fmt.Sprintf("a %s, not a Workflow", orElse(obj.GetKind(), "document without a kind"))})
				continue
			}
			base := strings.TrimSuffix(filepath.Base(rel), filepath.Ext(rel))
			name := strings.Trim(dnsUnsafe.ReplaceAllString(strings.ToLower(base), "-"), "-")
			if len(name) > 40 {
				name = strings.TrimRight(name[:40], "-")
			}
			obj.SetName(fmt.Sprintf("%s-%s-%d-%d", name, folderTag(dir), i, n))
			obj.SetGenerateName("")
			obj.SetNamespace(namespace)
			out = append(out, corpusWorkflow{key: key, obj: obj})
		}
	}
	return out, nil
}

// folderTag is a short tag of a corpus folder, so that two folders' workflows never share a name.
func folderTag(dir string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(dir))
	return strconv.FormatUint(uint64(h.Sum32()%1000), 10)
}

func orElse(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// corpusDirs are the folders of the corpus for version: E2E_CORPUS, comma-separated, an
// entry that starts with @ naming a folder of the controller's own module (in the module cache
// once hack/argo-controllers.sh built it); by default @examples.
func corpusDirs(t *testing.T, version string) []string {
	t.Helper()
	var out []string
	for _, entry := range strings.Split(orElse(os.Getenv("E2E_CORPUS"), "@examples"), ",") {
		rel, ok := strings.CutPrefix(entry, "@")
		if !ok {
			if !filepath.IsAbs(entry) {
				// make runs from the repository's root, go test from the package's folder.
				entry = filepath.Join(testenv.RepoRoot(), entry)
			}
			out = append(out, entry)
			continue
		}
		out = append(out, filepath.Join(argoModuleDir(t, version), rel))
	}
	return out
}

// argoModuleDir is the folder of the controller's module of version in the module cache.
func argoModuleDir(t *testing.T, version string) string {
	t.Helper()
	mod := "github.com/argoproj/argo-workflows/v3"
	if strings.HasPrefix(version, "v4.") {
		mod = "github.com/argoproj/argo-workflows/v4"
	}
	cmd := exec.Command("go", "mod", "download", "-json", mod+"@"+version)
	cmd.Dir = t.TempDir()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("finding Argo's module (go mod download %s@%s): %v: run 'make e2e-corpus', which builds the controller from that module first", mod, version, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download %s@%s said no folder: %s", mod, version, out)
	}
	return m.Dir
}

// corpusResult is what became of one workflow in one run.
type corpusResult struct {
	done           bool
	phase, message string
	// nodes: each node's type and phase, by name; pods: the pods created per node (the agent's
	// under "(agent)"); taskSets: the controller's writes of the workflow's TaskSet ("create
	// workflowtasksets 201"); events: the workflow's Events by reason (occurrences).
	nodes            map[string]string
	pods             map[string]int
	taskSets, events map[string]int
	// refusals are the controller's writes about the workflow the guard refused.
	refusals []string
	// roles: each pod created, Argo's role and the guard's (its audit annotation), by pod name.
	roles map[string][2]string
	// eventsDropped: the controller's Event recorder dropped Events in the run (its queue
	// full), so its Events are not all there.
	eventsDropped bool
	// eventCreates are the Events about the workflow the controller created (the audit log),
	// eventObjects those listed at the end: where an Event is missing from a run, they tell
	// whether the controller sent it.
	eventCreates, eventObjects int
	// stale is what the controller sent about the workflow after it completed (more than
	// afterCompletion after its finishedAt): pods by role and answer, TaskSet writes, Events
	// by reason.
	stale map[string]int
}

// phaseCrashed is the result of a workflow that crashed Argo's controller: the harness deleted
// it, as an operator must for the controller to run again, and restarted the controller.
const phaseCrashed = "CrashedTheController"

// phaseNotCreated is the result of a workflow the API server refused to create.
const phaseNotCreated = "NotCreated"

// leftOutPhases are the results of a workflow that did not run to compare: what happened in a
// run, and what is said of a run where it did not.
var leftOutPhases = []struct{ phase, what, otherwise string }{
	{phaseNotCreated, "the API server did not create it", "created"},
	{phaseCrashed, "crashed Argo's controller", "did not crash it"},
}

// leftOut says whether the workflow key did not run to compare in one of its two runs (a
// without the guard, b with it), how the report lists it (where: which runs), and whether it
// was so in one run only.
func leftOut(key, where string, a, b *corpusResult) (text string, oneSided, out bool) {
	for _, lp := range leftOutPhases {
		if a.phase != lp.phase && b.phase != lp.phase {
			continue
		}
		say := func(r *corpusResult) string {
			if r.phase != lp.phase {
				return lp.otherwise
			}
			return r.message
		}
		return fmt.Sprintf("%s: %s%s (without the guard: %s; with it: %s)", key, lp.what, where, say(a), say(b)),
			(a.phase == lp.phase) != (b.phase == lp.phase), true
	}
	return "", false, false
}

// maxControllerCrashes is how many times a run restarts a controller that crashed.
const maxControllerCrashes = 5

// supervisor keeps Argo's controller running through a corpus run as a Deployment would: when it
// exits, it reads the panic from its log, deletes the workflow the panic names (else the
// controller crashes on it again), and starts it again, up to maxControllerCrashes times.
type supervisor struct {
	mu      sync.Mutex
	ctrl    *testenv.Process
	crashed map[string]string // workflow name: the panic
	n       int
	gaveUp  bool // crashed past maxControllerCrashes, or could not be started again
	quit    chan struct{}
	done    chan struct{}
}

// panicKey finds the namespace/name key a panic line names ("... for key "ns/name" on ...").
var panicKey = regexp.MustCompile(`"` + regexp.QuoteMeta(namespace) + `/([a-z0-9][a-z0-9.-]*)"`)

func superviseController(ctx context.Context, t *testing.T, bin, kubeconfig, logFile string, out io.Writer, c client.Client) *supervisor {
	t.Helper()
	s := &supervisor{crashed: map[string]string{}, quit: make(chan struct{}), done: make(chan struct{})}
	s.ctrl = launchController(t, bin, kubeconfig, "info", nil, nil, out)
	go func() {
		defer close(s.done)
		var seen int
		for {
			s.mu.Lock()
			cur := s.ctrl
			s.mu.Unlock()
			select {
			case <-s.quit:
				return
			case <-ctx.Done():
				return
			case <-cur.Done():
			}
			logs := readFile(logFile)
			msg := "exited: " + orElse(fmt.Sprint(cur.Exited()), "no error")
			if i := strings.LastIndex(logs, "\npanic: "); i+1 >= seen {
				msg = strings.SplitN(logs[i+1:], "\n", 2)[0]
			}
			seen = len(logs)
			s.mu.Lock()
			s.n++
			if m := panicKey.FindStringSubmatch(msg); m != nil {
				s.crashed[m[1]] = msg
				wf := &unstructured.Unstructured{}
				wf.SetGroupVersionKind(argo.WorkflowGVK)
				wf.SetNamespace(namespace)
				wf.SetName(m[1])
				if err := c.Delete(ctx, wf); err != nil && !apierrors.IsNotFound(err) {
					t.Errorf("deleting %s, which crashed the controller: %v", m[1], err)
				}
			}
			t.Logf("Argo's controller crashed (%d): %s", s.n, msg)
			if s.n > maxControllerCrashes {
				s.gaveUp = true
				s.mu.Unlock()
				return
			}
			p, err := cur.Again()
			if err != nil {
				s.gaveUp = true
				s.mu.Unlock()
				t.Logf("restarting Argo's controller: %v", err)
				return
			}
			s.ctrl = p
			s.mu.Unlock()
		}
	}()
	return s
}

// stop stops the supervision, then the controller.
func (s *supervisor) stop() {
	close(s.quit)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.ctrl.Stop(controllerGrace)
}

// crashedBy says whether the workflow named name crashed the controller, and its panic.
func (s *supervisor) crashedBy(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg, ok := s.crashed[name]
	return msg, ok
}

// down says whether the supervision gave up: no controller runs any more.
func (s *supervisor) down() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gaveUp
}

// crashes is how many times the controller ended on its own.
func (s *supervisor) crashes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// corpusRun runs the corpus once on version: with the guard or without, with a stale pass
// forced or not, and returns what became of each workflow (by key).
func corpusRun(t *testing.T, version string, guarded, stale bool, wfs []corpusWorkflow, seed uint64, waitFor time.Duration, parallel int, podDir string) (map[string]*corpusResult, int) {
	t.Helper()
	runs.Add(1)
	ctrlBin, crds := controller(t, version)
	opts := testenv.Options{CRDDirs: []string{crds}, OwnCRDs: true}
	if guarded {
		opts.ValidatingWebhooks = []*admissionregistrationv1.ValidatingWebhookConfiguration{chartWebhook(t)}
	}
	var err error
	var auditLog string
	if opts.APIServerFlags, auditLog, err = testenv.AuditWrites(t.TempDir(), testenv.ControllerUser); err != nil {
		t.Fatal(err)
	}
	// The controller's metrics server off: nothing here reads it, and its port is then free for
	// another run of Argo's controller on this machine.
	env, ctx, stop := startAPIServer(t, opts, map[string]string{"metricsConfig": "enabled: false\n", "telemetryConfig": "enabled: false\n"})
	defer stop()
	c := env.Client
	var guardOut testenv.Output
	if guarded {
		g, err := testenv.StartGuard(ctx, guardBin, env.KubeConfig(), []string{"--webhook-port=" + strconv.Itoa(env.WebhookPort),
			"--webhook-cert-path=" + env.WebhookCertDir, "--shutdown-delay=0s"}, &guardOut)
		if err != nil {
			t.Fatalf("%v\n%s", err, guardOut.String())
		}
		defer func() { _ = g.Stop() }()
	}
	// The controller's and agents' logs: kept under E2E_LOG_DIR when set, one folder a run.
	logDir := t.TempDir()
	if dir := os.Getenv("E2E_LOG_DIR"); dir != "" {
		logDir = filepath.Join(dir, fmt.Sprintf("corpus-%s-guard-%v-stale-%v", version, guarded, stale))
		if err := os.MkdirAll(logDir, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	k := newKubelet(c, namespace)
	k.runtime = func(string) (time.Duration, bool) { return time.Second, false }
	k.report = taskResultReporter(c, version)
	if k.agents, err = newAgents(filepath.Join(filepath.Dir(ctrlBin), "argoexec"), env.Config, namespace, logDir); err != nil {
		t.Fatal(err)
	}
	defer k.agents.stop()
	go k.run(ctx)

	kc, ctrlCfg, err := env.KubeConfigAs(testenv.ControllerUser, "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	if stale {
		p := testenv.StartAPIProxyWith(t, ctrlCfg, testenv.APIProxyOptions{WatchDelay: watchLag})
		defer func() { _ = p.Close() }()
		kc = p.KubeConfig(t)
	}
	kcFile := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kcFile, kc, 0o600); err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(logDir, "controller.log")
	logOut, err := os.Create(logFile) //nolint:gosec // G304: the test's own temporary folder
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = logOut.Close() }()
	sup := superviseController(ctx, t, ctrlBin, kcFile, logFile, logOut, c)
	defer sup.stop()

	for _, w := range wfs {
		if w.support == nil {
			continue
		}
		if err := c.Create(ctx, w.support.DeepCopy()); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Logf("%s: the %s %s the workflows may use was not created: %v", w.key, w.support.GetKind(), w.support.GetName(), err)
		}
	}
	// Submit in a random order, at most parallel in flight at once, staggered as a queue would
	// be: the controller's Event recorder drops Events past its queue, which all of the corpus
	// at once would fill.
	order := slices.Clone(wfs)
	rand.New(rand.NewPCG(seed, 0)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	results := map[string]*corpusResult{}
	var submitted []*unstructured.Unstructured
	var submittedAt []time.Time
	const inFlightFor = 90 * time.Second
	for _, w := range order {
		if w.obj == nil {
			continue
		}
		obj := w.obj.DeepCopy()
		if stale {
			if _, ok, _ := unstructured.NestedFieldNoCopy(obj.Object, "spec", "podGC"); !ok {
				if err := unstructured.SetNestedField(obj.Object, "OnPodCompletion", "spec", "podGC", "strategy"); err != nil {
					t.Fatalf("%s: setting podGC for the stale run: %v", w.key, err)
				}
			}
		}
		r := &corpusResult{}
		results[w.key] = r
		if err := c.Create(ctx, obj); err != nil {
			r.done, r.phase, r.message = true, phaseNotCreated, err.Error()
			continue
		}
		submitted = append(submitted, obj)
		select {
		case <-ctx.Done():
		case <-time.After(300 * time.Millisecond):
		}
		submittedAt = append(submittedAt, time.Now())
		// In flight: not ended, and submitted less than inFlightFor ago (a suspended workflow
		// waits for good).
		if sup.down() {
			break
		}
		_ = wait.PollUntilContextTimeout(ctx, time.Second, waitFor, true, func(ctx context.Context) (bool, error) {
			if sup.down() {
				return true, nil
			}
			running := 0
			for i, wf := range submitted {
				if _, crashed := sup.crashedBy(wf.GetName()); crashed {
					continue
				}
				if time.Since(submittedAt[i]) < inFlightFor && !phase(ctx, c, wf).Terminal() {
					running++
				}
			}
			return running < parallel, nil
		})
	}
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, waitFor, true, func(ctx context.Context) (bool, error) {
		if sup.down() {
			return true, nil
		}
		for _, wf := range submitted {
			if _, crashed := sup.crashedBy(wf.GetName()); !crashed && !phase(ctx, c, wf).Terminal() {
				return false, nil
			}
		}
		return true, nil
	})
	if sup.down() {
		t.Fatalf("%s, guard %v, stale %v: Argo's controller crashed %d times and is not running any more: the run says nothing (its log: %s)",
			version, guarded, stale, sup.crashes(), logFile)
	}
	// A stale copy needs the lag of the controller's watch to come back and be reconciled.
	// The controller's Events go out after its writes (client-go's recorder, behind its
	// client's rate limit).
	pause := 15 * time.Second
	if stale {
		pause = settle
	}
	select {
	case <-ctx.Done():
	case <-time.After(pause):
	}

	writes, err := testenv.ReadWrites(auditLog)
	if err != nil {
		t.Fatalf("reading the API server's audit log: %v", err)
	}
	var events corev1.EventList
	if err := c.List(ctx, &events, client.InNamespace(namespace)); err != nil {
		t.Fatal(err)
	}
	for _, w := range wfs {
		r := results[w.key]
		if r == nil || r.phase == phaseNotCreated {
			continue
		}
		if msg, ok := sup.crashedBy(w.obj.GetName()); ok {
			r.done, r.phase, r.message = true, phaseCrashed, msg
			continue
		}
		wf := &unstructured.Unstructured{}
		wf.SetGroupVersionKind(argo.WorkflowGVK)
		if err := c.Get(ctx, client.ObjectKeyFromObject(w.obj), wf); err != nil {
			r.phase, r.message = "Gone", err.Error()
			continue
		}
		r.read(wf, k, writes, events.Items, stale)
		if podDir != "" && guarded && !stale {
			if err := dumpCorpusPods(podDir, version, w.key, wf, k, r); err != nil {
				t.Errorf("keeping the pods of %s: %v", w.key, err)
			}
		}
	}
	logs := readFile(logFile)
	dropped := strings.Count(logs, "too many queued events")
	for _, r := range results {
		r.eventsDropped = dropped > 0
	}
	// client-go's Event recorder logs each Event it does not send: no reference to the object,
	// refused by the API server, or its retries spent.
	t.Logf("%s, guard %v, stale %v: %d workflows submitted, seed %d; the controller crashed %d times; its own stale-copy check fired %d times; its Event recorder dropped %d (queue full), "+
		"could not refer to the object of %d, had %d refused and gave up on %d",
		version, guarded, stale, len(submitted), seed, sup.crashes(), strings.Count(logs, "Rejecting stale copy"), dropped,
		strings.Count(logs, "Could not construct reference"), strings.Count(logs, "Server rejected event"), strings.Count(logs, "retry limit exceeded"))
	return results, sup.crashes()
}

func readFile(path string) string {
	b, _ := os.ReadFile(path) //nolint:gosec // G304: the test's own files
	return string(b)
}

// read fills r from the workflow as it ended, the pods the kubelet stand-in saw, the
// controller's writes (the audit log) and the namespace's Events.
func (r *corpusResult) read(wf *unstructured.Unstructured, k *kubelet, writes []testenv.Write, events []corev1.Event, stale bool) {
	p, _, _ := unstructured.NestedString(wf.Object, "status", "phase")
	r.message, _, _ = unstructured.NestedString(wf.Object, "status", "message")
	r.phase, r.done = p, argo.Phase(p).Terminal()
	r.nodes, r.pods, r.taskSets, r.events, r.roles, r.stale = map[string]string{}, map[string]int{}, map[string]int{}, map[string]int{}, map[string][2]string{}, map[string]int{}
	nodes, _, _ := unstructured.NestedMap(wf.Object, "status", "nodes")
	for _, n := range nodes {
		m, _ := n.(map[string]any)
		name, _ := m["name"].(string)
		typ, _ := m["type"].(string)
		ph, _ := m["phase"].(string)
		r.nodes[name] = typ + " " + ph
	}
	roles := corpusRoles(wf)
	name := wf.GetName()
	byName := map[string]seenPod{}
	for _, s := range k.seenOf(name) {
		key := s.node
		if s.agent {
			key = "(agent)"
		}
		r.pods[key]++
		byName[s.name] = s
	}
	done := finishedAt(context.Background(), k.c, wf)
	for _, w := range writes {
		if w.User != testenv.ControllerUser || !about(name, w.Namespace, w.Name) {
			continue
		}
		decision, guardRole, guardReason := "", "", ""
		for key, v := range w.Annotations {
			switch {
			case strings.HasSuffix(key, ".exit-guard.io/decision"):
				decision = v
			case strings.HasSuffix(key, ".exit-guard.io/pod-kind"):
				guardRole = v
			case strings.HasSuffix(key, ".exit-guard.io/reason"):
				guardReason = v
			}
		}
		if w.Code == 429 || decision == "denied" {
			r.refusals = append(r.refusals, fmt.Sprintf("%s %s", w, w.Name))
		}
		if w.Resource == "workflowtasksets" {
			r.taskSets[w.String()]++
		}
		if w.Resource == "events" && w.Verb == "create" && w.Code/100 == 2 {
			r.eventCreates++
		}
		if w.Resource == "pods" && w.Verb == "create" && w.Subresource == "" && w.Code/100 == 2 {
			s, ok := byName[w.Name]
			argoRole := "(not seen)"
			switch {
			case ok && s.agent:
				argoRole = "agent"
			case ok:
				argoRole = roles(s.node)
			}
			if !stale {
				r.roles[w.Name] = [2]string{argoRole, guardRole}
			}
		}
		if stale && !done.IsZero() && w.At.After(done.Add(afterCompletion)) && (w.Resource == "pods" && w.Verb == "create" || w.Resource == "workflowtasksets") {
			what := w.String()
			if w.Resource == "pods" {
				what += " " + stalePodRole(byName[w.Name], guardRole)
			}
			if w.Resource == "workflowtasksets" && guardReason != "" {
				// Why the guard admitted or refused it: a write that adds no task hands the
				// agent nothing (idle).
				what += " (guard: " + guardReason + ")"
			}
			if w.Resource == "workflowtasksets" && removesTasksOnly(w.Request) {
				what += " " + rowRemovesTasks
			}
			r.stale[what]++
		}
	}
	for _, e := range events {
		if e.InvolvedObject.Kind != argo.Kind || e.InvolvedObject.Name != name || e.Source.Component != "workflow-controller" {
			// Argo's controller's Events only: the guard records its own refusals on the
			// Workflow too.
			continue
		}
		n := max(int(e.Count), 1)
		r.events[e.Reason] += n
		r.eventObjects++
		last := e.LastTimestamp.Time
		if last.IsZero() {
			last = e.EventTime.Time
		}
		if stale && !done.IsZero() && last.After(done.Add(afterCompletion)) {
			r.stale["Event "+e.Reason]++
		}
	}
}

// staleHarm says whether a row of what a stale pass sent (corpusResult.stale) is a write the
// guard is to refuse: a pod, a TaskSet write, a WorkflowFailed Event. Its other Events say the
// truth (WorkflowSucceeded again) or are the node Events of the completing pass.
func staleHarm(row string) bool {
	return strings.HasPrefix(row, "create pods ") || strings.Contains(row, " workflowtasksets ") && !strings.HasSuffix(row, rowRemovesTasks) ||
		row == "Event "+argo.EventReasonWorkflowFailed
}

// rowRemovesTasks ends the row of a TaskSet write that only removes tasks (removesTasksOnly).
const rowRemovesTasks = "(removes tasks only)"

// removesTasksOnly says whether a WorkflowTaskSet merge patch hands Argo's agent nothing: every
// task it names is set to null (Argo's cleanup of completed tasks, removeCompletedTaskSetStatus),
// and it sets no label but completed=true. Any other body, or none, may start work.
func removesTasksOnly(body []byte) bool {
	var p struct {
		Metadata struct {
			Labels map[string]*string `json:"labels"`
		} `json:"metadata"`
		Spec map[string]json.RawMessage `json:"spec"`
	}
	if len(body) == 0 || json.Unmarshal(body, &p) != nil {
		return false
	}
	for k, v := range p.Metadata.Labels {
		if k != argo.LabelCompleted || v == nil || *v != "true" {
			return false
		}
	}
	for k, v := range p.Spec {
		if k != "tasks" {
			return false
		}
		var tasks map[string]json.RawMessage
		if json.Unmarshal(v, &tasks) != nil {
			return false
		}
		for _, t := range tasks {
			if string(t) != "null" {
				return false
			}
		}
	}
	return true
}

// staleLanded says whether such a write landed: a 2xx answer, or an Event the API server kept.
func staleLanded(row string) bool {
	if strings.HasPrefix(row, "Event ") {
		return true
	}
	f := strings.Fields(row)
	return len(f) >= 3 && strings.HasPrefix(f[2], "2")
}

// stalePodRole names the role of a pod a stale pass sent: the guard's, when it judged it, or
// what Argo's labels on it say (no status holds a node the stale pass alone made).
func stalePodRole(s seenPod, guardRole string) string {
	switch {
	case guardRole != "":
		return guardRole
	case s.agent:
		return "agent"
	case s.onExit:
		return "exit-handler"
	case argo.InLifecycleHook(s.node, s.workflow):
		return "lifecycle-hook"
	case s.name == "":
		return "(not seen)"
	}
	return "step"
}

// corpusRoles returns the role Argo gives the pod of a node of wf, from its final status and
// its spec, as Argo builds them, without reading a pod's labels: a node is an exit handler's
// root when it is named GenerateOnExitNodeName(P) (P.onExit) for a P that declares one (the
// workflow: spec.onExit or spec.hooks.exit; a step or DAG task: its onExit or hooks.exit), a
// lifecycle hook's root when it is named P.hooks.<key> for a key other than exit that P
// declares; a pod's node has the role of the nearest such root above it (through the status'
// children), and is a step's under none.
func corpusRoles(wf *unstructured.Unstructured) func(node string) string {
	spec, _, _ := unstructured.NestedMap(wf.Object, "spec")
	exits, hooks := map[string]bool{}, map[string]map[string]bool{}
	declare := func(name string, m map[string]any) {
		if s, _ := m["onExit"].(string); s != "" {
			exits[name] = true
		}
		hs, _ := m["hooks"].(map[string]any)
		for key := range hs {
			if key == "exit" {
				exits[name] = true
				continue
			}
			if hooks[name] == nil {
				hooks[name] = map[string]bool{}
			}
			hooks[name][key] = true
		}
	}
	const workflowLevel = "\x00workflow"
	declare(workflowLevel, spec)
	templates, _ := spec["templates"].([]any)
	for _, tmpl := range templates {
		tm, _ := tmpl.(map[string]any)
		groups, _ := tm["steps"].([]any)
		for _, g := range groups {
			steps, _ := g.([]any)
			for _, s := range steps {
				sm, _ := s.(map[string]any)
				name, _ := sm["name"].(string)
				declare(name, sm)
			}
		}
		dag, _ := tm["dag"].(map[string]any)
		tasks, _ := dag["tasks"].([]any)
		for _, task := range tasks {
			tk, _ := task.(map[string]any)
			name, _ := tk["name"].(string)
			declare(name, tk)
		}
	}
	type node struct{ name, display string }
	nodes, _, _ := unstructured.NestedMap(wf.Object, "status", "nodes")
	byName := map[string]node{}
	parent := map[string]string{} // child name -> parent name
	byID := map[string]string{}
	for id, n := range nodes {
		m, _ := n.(map[string]any)
		name, _ := m["name"].(string)
		display, _ := m["displayName"].(string)
		byName[name] = node{name: name, display: display}
		byID[id] = name
	}
	for _, n := range nodes {
		m, _ := n.(map[string]any)
		name, _ := m["name"].(string)
		children, _ := m["children"].([]any)
		for _, c := range children {
			if id, ok := c.(string); ok && byID[id] != "" {
				parent[byID[id]] = name
			}
		}
	}
	// declarer is the name a node's step or task is declared under (its display name without
	// a loop's or retry's suffix), or the workflow's for the workflow itself.
	declarer := func(p string) string {
		if p == wf.GetName() {
			return workflowLevel
		}
		d := byName[p].display
		if i := strings.IndexByte(d, '('); i > 0 {
			d = d[:i]
		}
		return d
	}
	rootRole := func(n string) string {
		for p := range byName {
			if n == p+".onExit" && exits[declarer(p)] {
				return "exit-handler"
			}
			for key := range hooks[declarer(p)] {
				if n == p+".hooks."+key {
					return "lifecycle-hook"
				}
			}
		}
		if n == wf.GetName()+".onExit" && exits[workflowLevel] {
			return "exit-handler"
		}
		for key := range hooks[workflowLevel] {
			if n == wf.GetName()+".hooks."+key {
				return "lifecycle-hook"
			}
		}
		return ""
	}
	return func(n string) string {
		for seen := map[string]bool{}; n != "" && !seen[n]; n = parent[n] {
			seen[n] = true
			if role := rootRole(n); role != "" {
				return role
			}
		}
		return "step"
	}
}

// dumpCorpusPods writes the pods the controller created for wf in the guarded run, each with
// Argo's role and the guard's, into dir: the pods of test/chart's match-condition test.
func dumpCorpusPods(dir, version, key string, wf *unstructured.Unstructured, k *kubelet, r *corpusResult) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	for _, s := range k.seenOf(wf.GetName()) {
		roles, ok := r.roles[s.name]
		if !ok || s.meta == nil {
			continue
		}
		raw, err := json.MarshalIndent(map[string]any{"source": version + " " + key, "argoRole": roles[0], "guardRole": roles[1],
			"metadata": s.meta}, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, version+"-"+s.name+".json"), raw, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// taskResultReporter reports a pod's outputs as version's executor does, through a
// WorkflowTaskResult named by the node's ID: on 3.4 only when the template declares outputs,
// owned by the pod; from 3.5 always, owned by the workflow, labelled
// report-outputs-completed=true (the controller holds a node's success until it is). Each
// declared output parameter gets its valueFrom.default, else an empty value; a script's or a
// container's result is empty. The template comes from the pod (its ARGO_TEMPLATE variable).
func taskResultReporter(c client.Client, version string) func(ctx context.Context, pod *corev1.Pod) error {
	v34 := strings.HasPrefix(version, "v3.4.")
	return func(ctx context.Context, pod *corev1.Pod) error {
		nodeID := pod.Annotations["workflows.argoproj.io/node-id"]
		if nodeID == "" {
			return nil // not a node's pod
		}
		var tmpl map[string]any
		for _, ct := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			for _, e := range ct.Env {
				if e.Name == "ARGO_TEMPLATE" && tmpl == nil {
					if err := json.Unmarshal([]byte(e.Value), &tmpl); err != nil {
						return fmt.Errorf("ARGO_TEMPLATE: %w", err)
					}
				}
			}
		}
		outputs := map[string]any{}
		declared, _ := tmpl["outputs"].(map[string]any)
		params, _ := declared["parameters"].([]any)
		var values []any
		for _, p := range params {
			pm, _ := p.(map[string]any)
			value := ""
			if vf, ok := pm["valueFrom"].(map[string]any); ok {
				if d, ok := vf["default"].(string); ok {
					value = d
				}
			}
			values = append(values, map[string]any{"name": pm["name"], "value": value})
		}
		if len(values) > 0 {
			outputs["parameters"] = values
		}
		if _, ok := tmpl["script"]; ok {
			outputs["result"] = ""
		}
		if v34 && len(outputs) == 0 {
			return nil
		}
		tr := &unstructured.Unstructured{Object: map[string]any{}}
		tr.SetAPIVersion(argo.GroupVersion.String())
		tr.SetKind("WorkflowTaskResult")
		tr.SetNamespace(pod.Namespace)
		tr.SetName(nodeID)
		labels := map[string]string{argo.LabelWorkflow: pod.Labels[argo.LabelWorkflow]}
		if v34 {
			tr.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}})
		} else {
			labels["workflows.argoproj.io/report-outputs-completed"] = "true"
			for _, ref := range pod.OwnerReferences {
				if ref.Kind == argo.Kind {
					tr.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: ref.APIVersion, Kind: ref.Kind, Name: ref.Name, UID: ref.UID}})
				}
			}
		}
		tr.SetLabels(labels)
		if len(outputs) > 0 {
			tr.Object["outputs"] = outputs
		}
		err := c.Create(ctx, tr)
		if apierrors.IsAlreadyExists(err) {
			// A retry's pod of the same node, or a stale pass's: the newest outputs win.
			old := &unstructured.Unstructured{}
			old.SetGroupVersionKind(tr.GroupVersionKind())
			if err := c.Get(ctx, client.ObjectKeyFromObject(tr), old); err != nil {
				return err
			}
			tr.SetResourceVersion(old.GetResourceVersion())
			return c.Update(ctx, tr)
		}
		return err
	}
}

// corpusDiff lists how two runs of one workflow differ: final phase, each node's name, type
// and phase, the pods per node, and whether the TaskSet was written (by kind of write). Events
// are eventDiff's.
func corpusDiff(a, b *corpusResult) []string {
	var out []string
	if a.phase != b.phase {
		out = append(out, fmt.Sprintf("phase %s (%s) against %s (%s)", a.phase, a.message, b.phase, b.message))
	}
	out = append(out, mapDiff("node", a.nodes, b.nodes)...)
	out = append(out, mapDiff("pods of node", a.pods, b.pods)...)
	has := func(m map[string]int) map[string]bool {
		o := map[string]bool{}
		for k, n := range m {
			o[k] = n > 0
		}
		return o
	}
	return append(out, mapDiff("TaskSet write", has(a.taskSets), has(b.taskSets))...)
}

// eventDiff lists how the two runs' Events that end the workflow differ (terminalEvents), where
// both runs kept every Event (eventsComparable). Reported apart, not failing the run: Argo's
// controller lost such Events at random, in both directions and in runs without the guard as
// with it (docs/evidence/corpus.md), for a cause not yet found.
func eventDiff(a, b *corpusResult) []string {
	if !eventsComparable(a) || !eventsComparable(b) {
		return nil
	}
	return mapDiff("Event reason", terminalEvents(a.events), terminalEvents(b.events))
}

// terminalEvents says which of the Events that end a workflow (WorkflowSucceeded,
// WorkflowFailed for Failed and Error, WorkflowTimedOut) were recorded about it. The others
// (WorkflowRunning, WorkflowNode*) depend on which states of a pod a pass happened to see: a
// node whose pod ran and ended between two passes gets no WorkflowNodeRunning, in either run.
func terminalEvents(events map[string]int) map[string]bool {
	out := map[string]bool{}
	for _, reason := range []string{"WorkflowSucceeded", "WorkflowFailed", "WorkflowTimedOut"} {
		out[reason] = events[reason] > 0
	}
	return out
}

// eventBurst is client-go's spam filter's burst: its Event recorder sends at most 25 Events
// about one object at once (then one every 5 minutes) and drops the rest.
const eventBurst = 25

// eventsComparable says whether the run kept every Event the controller recorded about the
// workflow: fewer than the recorder's burst, and none dropped for a full queue.
func eventsComparable(r *corpusResult) bool {
	n := 0
	for _, c := range r.events {
		n += c
	}
	return !r.eventsDropped && n < eventBurst
}

func mapDiff[V comparable](what string, a, b map[string]V) []string {
	var out []string
	for _, k := range sortedKeys(a, b) {
		va, oka := a[k]
		vb, okb := b[k]
		switch {
		case !oka:
			out = append(out, fmt.Sprintf("%s %s: none without the guard, %v with it", what, k, vb))
		case !okb:
			out = append(out, fmt.Sprintf("%s %s: %v without the guard, none with it", what, k, va))
		case va != vb:
			out = append(out, fmt.Sprintf("%s %s: %v without the guard, %v with it", what, k, va, vb))
		}
	}
	return out
}

func sortedKeys[V any](ms ...map[string]V) []string {
	var keys []string
	for _, m := range ms {
		for k := range m {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	slices.Sort(keys)
	return keys
}

// corpusLine is one controller line's figures, for the report's table.
type corpusLine struct {
	version string
	// pairRun: the plain runs without and with the guard were made (E2E_CORPUS_STALE is not
	// "only"); their columns say "not run" otherwise.
	pairRun                                 bool
	run, completed, differences, refusals   int
	mismatches                              int
	staleRun                                bool
	staleSent, staleThrough, staleRefused   int
	diffs, notRun, notCompleted, roleErrors []string
	staleExceptions, staleSentRows          []string
	staleByPolicy, staleOtherRows           []string
	// staleNotCounted: workflows of the stale runs whose stale pass could not be counted
	// (crashed the controller, or did not complete).
	staleNotCounted []string
	// crashes: how many times Argo's controller crashed, over the line's runs.
	crashes int
	// phases: the workflows by final phase with the guard ("Succeeded": n).
	phases                        map[string]int
	eventsNotCompared, eventDiffs []string
}

// TestCorpus runs the corpus on each version (make e2e-corpus; .ci/run runs a short pick).
func TestCorpus(t *testing.T) {
	versions := strings.Split(orElse(os.Getenv("E2E_CORPUS_VERSIONS"), "v3.4.17"), ",")
	var pick []string
	if s := os.Getenv("E2E_CORPUS_PICK"); s != "" {
		pick = strings.Split(s, ",")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("E2E_CORPUS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("E2E_CORPUS_SEED=%q: %v", s, err)
		}
	}
	waitFor := 4 * time.Minute
	if s := os.Getenv("E2E_CORPUS_WAIT"); s != "" {
		var err error
		if waitFor, err = time.ParseDuration(s); err != nil {
			t.Fatalf("E2E_CORPUS_WAIT=%q: %v", s, err)
		}
	}
	// E2E_CORPUS_STALE: 1 the stale pair after the plain one, only the stale pair alone.
	stale := os.Getenv("E2E_CORPUS_STALE") == "1" || os.Getenv("E2E_CORPUS_STALE") == "only"
	staleOnly := os.Getenv("E2E_CORPUS_STALE") == "only"
	parallel := 10
	if s := os.Getenv("E2E_CORPUS_PARALLEL"); s != "" {
		var err error
		if parallel, err = strconv.Atoi(s); err != nil || parallel < 1 {
			t.Fatalf("E2E_CORPUS_PARALLEL=%q: want a positive number", s)
		}
	}
	var lines []corpusLine
	for _, version := range versions {
		t.Run(version, func(t *testing.T) {
			dirs := corpusDirs(t, version)
			var wfs []corpusWorkflow
			for _, dir := range dirs {
				some, err := loadCorpus(dir, pick)
				if err != nil {
					t.Fatal(err)
				}
				if len(dirs) > 1 {
					for i := range some {
						some[i].key = filepath.Base(dir) + "/" + some[i].key
					}
				}
				wfs = append(wfs, some...)
			}
			if len(pick) > 0 {
				var found []string
				for _, w := range wfs {
					found = append(found, w.key)
				}
				for _, p := range pick {
					if !slices.ContainsFunc(found, func(k string) bool {
						return k == p || strings.HasSuffix(k, "/"+p) || strings.HasPrefix(k, p+"#") || strings.Contains(k, "/"+p+"#")
					}) {
						t.Fatalf("E2E_CORPUS_PICK names %s, which is in none of %v", p, dirs)
					}
				}
			}
			line := corpusLine{version: version, staleRun: stale}
			for _, w := range wfs {
				if w.obj == nil && w.support == nil {
					line.notRun = append(line.notRun, w.key+": "+w.skip)
				}
			}
			line.pairRun = !staleOnly
			without, with := map[string]*corpusResult{}, map[string]*corpusResult{}
			if !staleOnly {
				var n, m int
				without, n = corpusRun(t, version, false, false, wfs, seed, waitFor, parallel, "")
				with, m = corpusRun(t, version, true, false, wfs, seed+1, waitFor, parallel, os.Getenv("E2E_CORPUS_PODS"))
				line.crashes += n + m
			}
			for _, w := range wfs {
				a, b := without[w.key], with[w.key]
				if a == nil || b == nil {
					continue
				}
				if text, oneSided, out := leftOut(w.key, "", a, b); out {
					// Left out, as a user's cluster would have to leave it out; in one run only
					// it is a difference (the guard's doing, until shown otherwise).
					line.notRun = append(line.notRun, text)
					if oneSided {
						line.differences++
						line.diffs = append(line.diffs, text)
					}
					continue
				}
				line.run++
				if line.phases == nil {
					line.phases = map[string]int{}
				}
				line.phases[orElse(b.phase, "no phase")]++
				if a.phase == "" || b.phase == "" {
					// Every workflow gets a phase on the controller's first pass, even one it
					// cannot run: none means the controller did not reconcile it.
					t.Errorf("%s %s: no phase without the guard (%q) or with it (%q): the controller never reconciled it", version, w.key, a.phase, b.phase)
				}
				if a.done && b.done {
					line.completed++
				} else {
					line.notCompleted = append(line.notCompleted, fmt.Sprintf("%s: %s without the guard, %s with it (%s)", w.key, orElse(a.phase, "no phase"), orElse(b.phase, "no phase"), orElse(b.message, a.message)))
				}
				if !eventsComparable(a) || !eventsComparable(b) {
					line.eventsNotCompared = append(line.eventsNotCompared, w.key)
				}
				if d := eventDiff(a, b); len(d) > 0 {
					line.eventDiffs = append(line.eventDiffs, fmt.Sprintf("%s: %s (Events created by the controller, as audited, and listed at the end: %d and %d without the guard, %d and %d with it)",
						w.key, strings.Join(d, "; "), a.eventCreates, a.eventObjects, b.eventCreates, b.eventObjects))
				}
				if d := corpusDiff(a, b); len(d) > 0 {
					line.differences++
					line.diffs = append(line.diffs, w.key+": "+strings.Join(d, "; "))
				}
				line.refusals += len(b.refusals)
				for _, r := range b.refusals {
					t.Errorf("%s %s: the guard refused %s in a run with no stale pass", version, w.key, r)
				}
				for _, pod := range sortedKeys(b.roles) {
					if roles := b.roles[pod]; roles[0] != roles[1] {
						line.mismatches++
						line.roleErrors = append(line.roleErrors, fmt.Sprintf("%s pod %s: Argo's role %s, the guard's %s", w.key, pod, roles[0], orElse(roles[1], "(none)")))
					}
				}
			}
			for _, d := range line.diffs {
				t.Errorf("%s: %s", version, d)
			}
			for _, e := range line.roleErrors {
				t.Errorf("%s: %s", version, e)
			}
			if stale {
				sw, n := corpusRun(t, version, false, true, wfs, seed+2, waitFor, parallel, "")
				sg, m := corpusRun(t, version, true, true, wfs, seed+3, waitFor, parallel, "")
				line.crashes += n + m
				sent, other, otherWith := map[string]int{}, map[string]int{}, map[string]int{}
				for _, w := range wfs {
					a, b := sw[w.key], sg[w.key]
					if a == nil || b == nil {
						continue
					}
					if text, oneSided, out := leftOut(w.key, " in a stale run", a, b); out {
						line.staleNotCounted = append(line.staleNotCounted, text)
						if oneSided {
							t.Errorf("%s %s", version, text)
						}
						continue
					}
					if a.phase == "" || b.phase == "" {
						t.Errorf("%s %s: no phase in a stale run without the guard (%q) or with it (%q): the controller never reconciled it", version, w.key, a.phase, b.phase)
					}
					if !a.done || !b.done {
						// A stale pass comes after completion: one that never completed sent
						// nothing to count.
						line.staleNotCounted = append(line.staleNotCounted, fmt.Sprintf("%s: not completed in a stale run: %s without the guard, %s with it",
							w.key, orElse(a.phase, "no phase"), orElse(b.phase, "no phase")))
					}
					if staleOnly {
						line.run++
						if line.phases == nil {
							line.phases = map[string]int{}
						}
						line.phases[orElse(b.phase, "no phase")]++
					}
					for row, n := range a.stale {
						if staleHarm(row) && staleLanded(row) {
							line.staleSent += n
							sent[row] += n
						} else {
							other[row] += n
						}
					}
					for row, n := range b.stale {
						if !staleHarm(row) {
							otherWith[row] += n
						}
						switch {
						case !staleHarm(row):
						case !staleLanded(row):
							line.staleRefused += n
						case b.phase != string(argo.PhaseSucceeded):
							// The guard's default deny phases: Succeeded alone.
							line.staleByPolicy = append(line.staleByPolicy, fmt.Sprintf("%s (%s): %s ×%d", w.key, orElse(b.phase, "no phase"), row, n))
						default:
							line.staleThrough += n
							line.staleExceptions = append(line.staleExceptions, fmt.Sprintf("%s: %s ×%d", w.key, row, n))
						}
					}
				}
				line.staleOtherRows = []string{"without the guard: " + rowsText(other), "with the guard: " + rowsText(otherWith)}
				line.staleSentRows = []string{rowsText(sent)}
				for _, e := range line.staleExceptions {
					t.Errorf("%s, a stale pass with the guard: %s got through", version, e)
				}
			}
			if line.run == 0 {
				t.Errorf("no Workflow in %v: nothing was compared", dirs)
			}
			t.Logf("%s: %d workflows run, %d completed in both runs, %d differences, %d refusals, %d role mismatches; not run: %d",
				version, line.run, line.completed, line.differences, line.refusals, line.mismatches, len(line.notRun))
			lines = append(lines, line)
		})
	}
	if path := os.Getenv("E2E_CORPUS_REPORT"); path != "" {
		if err := os.WriteFile(path, []byte(corpusReport(lines, seed)), 0o600); err != nil {
			t.Error(err)
		}
	}
}

// corpusReport is the run's figures in Markdown: the summary table, then every difference,
// refusal, mismatch, workflow not run or not completed, and stale write through.
func corpusReport(lines []corpusLine, seed uint64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| line | workflows run | completed in both | differences | refusals | role mismatches | stale writes sent without the guard | stale writes through with it, of workflows that Succeeded | terminal Events in one run only |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, l := range lines {
		sent, through := "not run", "not run"
		if l.staleRun {
			sent, through = strconv.Itoa(l.staleSent), strconv.Itoa(l.staleThrough)
		}
		pair := []string{strconv.Itoa(l.completed), strconv.Itoa(l.differences), strconv.Itoa(l.refusals), strconv.Itoa(l.mismatches)}
		events := strconv.Itoa(len(l.eventDiffs))
		if !l.pairRun {
			pair, events = []string{"not run", "not run", "not run", "not run"}, "not run"
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s |\n", l.version, l.run, strings.Join(pair, " | "), strings.Join([]string{sent, through}, " | "), events)
	}
	fmt.Fprintf(&b, "\nOrder seed %d.\n", seed)
	for _, l := range lines {
		var ps []string
		for _, p := range sortedKeys(l.phases) {
			ps = append(ps, fmt.Sprintf("%s %d", p, l.phases[p]))
		}
		run := "its run"
		if !l.pairRun {
			run = "its stale run"
		}
		fmt.Fprintf(&b, "\n%s, final phases with the guard (%s): %s. Argo's controller crashed %d times over the line's runs (restarted each time, the workflow its panic names deleted).\n",
			l.version, run, strings.Join(ps, ", "), l.crashes)
	}
	for _, l := range lines {
		fmt.Fprintf(&b, "\n## %s\n", l.version)
		for _, sec := range []struct {
			title string
			items []string
		}{
			{"Differences", l.diffs}, {"Role mismatches", l.roleErrors}, {"Not run", l.notRun}, {"Not completed within the wait", l.notCompleted},
			{"Events not compared (25 or more about the workflow, past client-go's per-object burst, or the recorder's queue full)", l.eventsNotCompared},
			{"Events that end the workflow, recorded in one run and not the other (not failing the run)", l.eventDiffs},
			{"What the stale passes sent without the guard: pods, TaskSet writes, WorkflowFailed Events", l.staleSentRows},
			{"Stale writes through with the guard, of workflows that Succeeded (goal 0)", l.staleExceptions},
			{"Stale writes admitted with the guard, of workflows that did not succeed (its default deny phases: Succeeded)", l.staleByPolicy},
			{"Other writes after completion in the stale runs (refused ones, TaskSet cleanups, other Events)", l.staleOtherRows},
			{"Workflows of the stale runs not counted", l.staleNotCounted},
		} {
			plain := !strings.HasPrefix(sec.title, "Not run") && !strings.Contains(sec.title, "stale") && !strings.Contains(sec.title, "Stale")
			if plain && !l.pairRun || !plain && !l.staleRun && sec.title != "Not run" {
				fmt.Fprintf(&b, "\n### %s: not run\n", sec.title)
				continue
			}
			fmt.Fprintf(&b, "\n### %s (%d)\n\n", sec.title, len(sec.items))
			for _, it := range sec.items {
				fmt.Fprintf(&b, "- %s\n", strings.ReplaceAll(it, "\n", " "))
			}
		}
	}
	return b.String()
}
