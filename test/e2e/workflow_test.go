//go:build e2e

package e2e

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/exit-guard/exit-guard/internal/argo"
)

// referenceWorkflow is the reference scenario of ARGO.md in the shape that lets a stale copy
// through: two parallel main pods, podGC OnPodCompletion, and an exit handler that notifies
// only when {{workflow.status}} != Succeeded. A failing one has its second pod fail.
func referenceWorkflow(fail bool) *unstructured.Unstructured {
	second := "b"
	if fail {
		second = "fail"
	}
	container := func(name, msg string) map[string]any {
		return map[string]any{"name": name, "container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo " + msg}}}
	}
	return newWorkflow("notify-on-failure-", map[string]any{
		"entrypoint": "main",
		"onExit":     "exit-handler",
		"podGC":      map[string]any{"strategy": "OnPodCompletion"},
		"templates": []any{
			map[string]any{"name": "main", "steps": []any{[]any{
				map[string]any{"name": "a", "template": "work"},
				map[string]any{"name": second, "template": "work"},
			}}},
			container("work", "working"),
			container("notify-failure", "workflow failed"),
			map[string]any{"name": "exit-handler", "steps": []any{[]any{map[string]any{
				"name": "notify", "template": "notify-failure", "when": "{{workflow.status}} != Succeeded"}}}},
		},
	})
}

// newWorkflow is a Workflow of the test's namespace, named from generateName, with spec.
func newWorkflow(generateName string, spec map[string]any) *unstructured.Unstructured {
	wf := &unstructured.Unstructured{}
	wf.SetGroupVersionKind(argo.WorkflowGVK)
	wf.SetNamespace(namespace)
	wf.SetGenerateName(generateName)
	wf.Object["spec"] = spec
	return wf
}

// withMetrics gives wf a workflow-level counter and a template-level one (on its work steps)
// of runs that did not succeed, labelled by the workflow's name, as a user who alerts on them
// would write them.
func withMetrics(wf *unstructured.Unstructured) {
	counter := func(name string) map[string]any {
		return map[string]any{"prometheus": []any{map[string]any{
			"name": name, "help": "Runs that did not succeed.",
			"labels": []any{map[string]any{"key": "workflow", "value": "{{workflow.name}}"}},
			"when":   "{{status}} != Succeeded", "counter": map[string]any{"value": "1"},
		}}}
	}
	spec := wf.Object["spec"].(map[string]any)
	spec["metrics"] = counter(strings.TrimPrefix(workflowMetric, "argo_workflows_"))
	for _, tmpl := range spec["templates"].([]any) {
		if t := tmpl.(map[string]any); t["name"] == "work" {
			t["metrics"] = counter(strings.TrimPrefix(templateMetric, "argo_workflows_"))
		}
	}
}

// censusMemo is the ConfigMap of the census workflows' memoization cache.
const censusMemo = "census-memo"

// withCensusFeatures gives wf what a stale pass might write again beside its exit handler: a
// second step group (a stale copy from before it started lacks its node, argo-workflows
// #16294), a volume claim template mounted by its work steps (PVCs created at the start,
// deleted at completion: volumeClaimGC OnWorkflowCompletion), a PodDisruptionBudget, and a
// memoized step (its cache in the ConfigMap censusMemo). Artifact GC is not in it: it needs an artifact repository,
// which the test API server has none of.
func withCensusFeatures(wf *unstructured.Unstructured) {
	spec := wf.Object["spec"].(map[string]any)
	spec["volumeClaimTemplates"] = []any{map[string]any{
		"metadata": map[string]any{"name": "scratch"},
		"spec": map[string]any{"accessModes": []any{"ReadWriteOnce"},
			"resources": map[string]any{"requests": map[string]any{"storage": "1Mi"}}},
	}}
	spec["volumeClaimGC"] = map[string]any{"strategy": "OnWorkflowCompletion"}
	spec["podDisruptionBudget"] = map[string]any{"minAvailable": 1}
	templates := spec["templates"].([]any)
	for _, tmpl := range templates {
		t := tmpl.(map[string]any)
		switch t["name"] {
		case "work":
			t["container"].(map[string]any)["volumeMounts"] = []any{map[string]any{"name": "scratch", "mountPath": "/scratch"}}
		case "main":
			steps := t["steps"].([]any)
			steps[0] = append(steps[0].([]any), map[string]any{"name": "memo", "template": "memoized"})
			// A second step group: a stale copy from before it started lacks its node.
			t["steps"] = append(steps, []any{map[string]any{"name": "then", "template": "work"}})
		}
	}
	spec["templates"] = append(templates, map[string]any{
		"name":      "memoized",
		"memoize":   map[string]any{"key": "{{workflow.name}}", "cache": map[string]any{"configMap": map[string]any{"name": censusMemo}}},
		"container": map[string]any{"image": "busybox", "command": []any{"sh", "-c", "echo memo"}},
	})
}

// The failure hooks a scenario gives its workflows (scenario.hook), as users write them.
const (
	noHook = ""
	// hookWorkflow: a workflow-level hook, node <wf>.hooks.failed (upstream #10345 sets one for
	// every workflow through workflowDefaults).
	hookWorkflow = "workflow-level"
	// hookStep: a hook on the second step, node <wf>[0].<step>.hooks.failed.
	hookStep = "step-level"
	// hookDAG: a DAG entrypoint whose second task has a hook (<wf>.<task>.hooks.failed) and an
	// onExit of its own (<wf>.<task>.onExit), which notifies whatever the task's outcome.
	hookDAG = "DAG task"
)

// withFailureHook gives wf the failure hook of shape, each running the notification template
// once what it watches has failed; its pods carry no on-exit label. A stale pass sends the
// workflow-level one first and alone (docs/decisions.md, "What a pod is").
func withFailureHook(wf *unstructured.Unstructured, shape string) {
	spec := wf.Object["spec"].(map[string]any)
	templates := spec["templates"].([]any)
	main := templates[0].(map[string]any)
	steps := main["steps"].([]any)[0].([]any)
	second := steps[1].(map[string]any)["name"].(string)
	failed := func(scope string) string {
		return fmt.Sprintf(`%s["%s"].status == "Failed" || %s["%s"].status == "Error"`, scope, second, scope, second)
	}
	switch shape {
	case hookWorkflow:
		spec["hooks"] = map[string]any{"failed": map[string]any{"expression": `workflow.status == "Failed" || workflow.status == "Error"`, "template": "notify-failure"}}
	case hookStep:
		steps[1].(map[string]any)["hooks"] = map[string]any{"failed": map[string]any{"expression": failed("steps"), "template": "notify-failure"}}
	case hookDAG:
		var tasks []any
		for i, st := range steps {
			task := map[string]any{"name": st.(map[string]any)["name"], "template": st.(map[string]any)["template"]}
			if i == 1 {
				task["hooks"] = map[string]any{"failed": map[string]any{"expression": failed("tasks"), "template": "notify-failure"}}
				task["onExit"] = "notify-failure"
			}
			tasks = append(tasks, task)
		}
		delete(main, "steps")
		main["dag"] = map[string]any{"tasks": tasks}
	}
}
