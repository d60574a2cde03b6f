//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// agents runs Argo's real agent, `argoexec agent main` built from the same module as the
// controller, for each agent pod the kubelet stand-in sees: as a process on this machine with
// the pod's main container's arguments and environment, a kubeconfig for the test API server
// in place of the pod's ServiceAccount token, and its namespace. The agent needs nothing else
// of a container: it watches its WorkflowTaskSet, makes the HTTP calls itself and writes the
// results to the TaskSet's status.
type agents struct {
	bin, kubeconfig, logDir string

	mu    sync.Mutex
	procs map[types.UID]*agentProc
}

type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	code int
}

func newAgents(bin string, cfg *rest.Config, namespace, logDir string) (*agents, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["agent"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}
	kc.Contexts["agent"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "agent", Namespace: namespace}
	kc.CurrentContext = "agent"
	path := filepath.Join(logDir, "agent-kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return nil, err
	}
	return &agents{bin: bin, kubeconfig: path, logDir: logDir, procs: map[types.UID]*agentProc{}}, nil
}

// start runs the agent of pod once; it reports whether the pod is an agent pod.
func (a *agents) start(pod *corev1.Pod) (bool, error) {
	if a == nil || pod.Labels["workflows.argoproj.io/component"] != "agent" {
		return false, nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.procs[pod.UID]; ok {
		return true, nil
	}
	var main *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == "main" {
			main = &pod.Spec.Containers[i]
		}
	}
	if main == nil || len(main.Command) == 0 || main.Command[0] != "argoexec" {
		return true, fmt.Errorf("agent pod %s has no main container running argoexec", pod.Name)
	}
	args := append(append(append([]string{}, main.Command[1:]...), main.Args...), "--kubeconfig="+a.kubeconfig, "--namespace="+pod.Namespace)
	cmd := exec.Command(a.bin, args...) //nolint:gosec // G204: Argo's argoexec, built by hack/argo-controllers.sh
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}
	for _, e := range main.Env {
		v := e.Value
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				v = pod.Name
			case "metadata.namespace":
				v = pod.Namespace
			case "metadata.uid":
				v = string(pod.UID)
			}
		}
		cmd.Env = append(cmd.Env, e.Name+"="+v)
	}
	log, err := os.Create(filepath.Join(a.logDir, "agent-"+pod.Name+"-"+string(pod.UID)[:8]+".log"))
	if err != nil {
		return true, err
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return true, err
	}
	p := &agentProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		p.code = cmd.ProcessState.ExitCode()
		_ = log.Close()
		close(p.done)
	}()
	a.procs[pod.UID] = p
	return true, nil
}

// exited says whether the agent of the pod with uid has ended, and its exit code.
func (a *agents) exited(uid types.UID) (bool, int) {
	a.mu.Lock()
	p, ok := a.procs[uid]
	a.mu.Unlock()
	if !ok {
		return false, 0
	}
	select {
	case <-p.done:
		return true, p.code
	default:
		return false, 0
	}
}

// keep kills the agents whose pods are gone, as the kubelet would. The agent ignores SIGTERM
// on these versions, so it gets SIGKILL (what the kubelet sends after the grace period).
func (a *agents) keep(alive map[types.UID]bool) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for uid, p := range a.procs {
		if !alive[uid] {
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
		}
	}
}

// stop kills every agent and waits for them.
func (a *agents) stop() {
	if a == nil {
		return
	}
	a.keep(nil)
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.procs {
		<-p.done
	}
}

// notifier is the HTTP endpoint the workflows' exit handlers call: it counts the calls per
// workflow, on loopback.
type notifier struct {
	srv *httptest.Server

	mu    sync.Mutex
	calls map[string]int
	last  map[string]time.Time // when the last call of each key came
}

func newNotifier() *notifier {
	n := &notifier{calls: map[string]int{}, last: map[string]time.Time{}}
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wf, ok := strings.CutPrefix(r.URL.Path, "/notify/")
		if !ok {
			wf = r.URL.Path // a ping: not a notification
		}
		n.mu.Lock()
		n.calls[wf]++
		n.last[wf] = time.Now()
		n.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	return n
}

// url is what a workflow's exit handler calls; the workflow's name ends the path.
func (n *notifier) url() string { return n.srv.URL + "/notify/{{workflow.name}}" }

// pingURL is what an HTTP step of the main steps calls: counted apart from notifications.
func (n *notifier) pingURL() string { return n.srv.URL + "/ping/{{workflow.name}}" }

func (n *notifier) count(wf string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.calls[wf]
}

// lastCall is when key (a workflow's name, or "/ping/" and its name) was last called.
func (n *notifier) lastCall(key string) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last[key]
}

func (n *notifier) close() { n.srv.Close() }
