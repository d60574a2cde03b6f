package lockwatch

import (
	"encoding/json"
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// workflowView is the part of a Workflow the scan reads: its metadata, the locks its spec
// declares, and its status's message and synchronization. A workflow is decoded into it
// straight from the API server's answer, so that its node tree (status.nodes, most of a large
// workflow) is skipped by the decoder, never held.
type workflowView struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Synchronization syncSpec `json:"synchronization"`
	} `json:"spec"`
	Status struct {
		Message         string     `json:"message"`
		Synchronization syncStatus `json:"synchronization"`
	} `json:"status"`
}

// syncSpec is a workflow's spec.synchronization: the locks it takes.
type syncSpec struct {
	Mutex      *lockRef  `json:"mutex"`
	Mutexes    []lockRef `json:"mutexes"`
	Semaphore  *lockRef  `json:"semaphore"`
	Semaphores []lockRef `json:"semaphores"`
}

// lockRef is a mutex (its name) or a semaphore (its ConfigMap key), and the namespace it lives
// in when not the workflow's.
type lockRef struct {
	Name            string `json:"name"`
	Namespace       string `json:"namespace"`
	ConfigMapKeyRef *struct {
		Name string `json:"name"`
		Key  string `json:"key"`
	} `json:"configMapKeyRef"`
}

// syncStatus is a workflow's status.synchronization: the locks it holds and waits on.
type syncStatus struct {
	Mutex     lockEntries `json:"mutex"`
	Semaphore lockEntries `json:"semaphore"`
}

type lockEntries struct {
	Holding []lockEntry `json:"holding"`
	Waiting []lockEntry `json:"waiting"`
}

// lockEntry names a lock (mutex or semaphore, as the entry's kind has it) and its holders: one
// for a mutex, several for a semaphore.
type lockEntry struct {
	Mutex     string   `json:"mutex"`
	Semaphore string   `json:"semaphore"`
	Holder    string   `json:"holder"`
	Holders   []string `json:"holders"`
}

type workflowViewList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []workflowView `json:"items"`
}

// DeepCopyObject implements runtime.Object. The views are read once and never shared, so a
// copy through JSON (which they are read from) is enough.
func (v *workflowView) DeepCopyObject() runtime.Object { return deepCopy(v) }

// DeepCopyObject implements runtime.Object.
func (l *workflowViewList) DeepCopyObject() runtime.Object { return deepCopy(l) }

func deepCopy[T any](v *T) *T {
	if v == nil {
		return nil
	}
	raw, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("lockwatch: copying a %T: %v", v, err))
	}
	out := new(T)
	if err := json.Unmarshal(raw, out); err != nil {
		panic(fmt.Sprintf("lockwatch: copying a %T: %v", v, err))
	}
	return out
}

// NewReader returns the live client a Watcher reads through: its own scheme decodes Workflows
// into views (Argo's types and the manager's scheme are not involved), over httpClient (nil: one
// of its own from cfg).
func NewReader(cfg *rest.Config, httpClient *http.Client) (client.Reader, error) {
	s := runtime.NewScheme()
	s.AddKnownTypeWithName(argo.WorkflowGVK, &workflowView{})
	s.AddKnownTypeWithName(argo.WorkflowListGVK, &workflowViewList{})
	metav1.AddToGroupVersion(s, argo.GroupVersion)
	c, err := client.New(cfg, client.Options{Scheme: s, HTTPClient: httpClient})
	if err != nil {
		return nil, fmt.Errorf("lockwatch: %w", err)
	}
	return c, nil
}
