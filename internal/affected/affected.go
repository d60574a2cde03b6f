// Package affected finds Argo Workflows' controllers in a cluster and says, before anything is
// installed, whether each one sends what exit-guard refuses: stale passes of completed
// workflows (its release, INFORMER_WRITE_BACK on 4.0.0 to 4.0.6) or two controllers at once
// (LEADER_ELECTION_DISABLE=true with a rollout that overlaps, argo-workflows #16034). It reads
// Deployments and ConfigMaps, nothing else, and writes nothing.
package affected

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/exit-guard/exit-guard/internal/argorelease"
)

// Selectors are the labels Argo's own manifests give the controller's pods: upstream's
// install.yaml (and Kubeflow Pipelines, which bundles it) and the argo-workflows chart
// (argo-helm). A controller is found by what its installer says it is, never by its name.
var Selectors = []Selector{
	{Labels: map[string]string{"app": "workflow-controller"}, Source: "upstream's install.yaml labels (app=workflow-controller)"},
	{Labels: map[string]string{"app.kubernetes.io/component": "workflow-controller"},
		Source: "the argo-workflows chart's labels (app.kubernetes.io/component=workflow-controller)"},
}

// Selector is one installer's labels.
type Selector struct {
	Labels map[string]string
	Source string
}

const (
	// kfpLabel is the label Kubeflow Pipelines' manifests put on every object they install,
	// the Argo they bundle included.
	kfpLabel, kfpValue = "application-crd-id", "kubeflow-pipelines"
	// kfpConfig is Kubeflow Pipelines' install ConfigMap, in the namespace of its Argo; its
	// appVersion is the KFP release.
	kfpConfig = "pipeline-install-config"
)

// Controller is what the Deployment of one workflow controller says.
type Controller struct {
	Namespace, Name string
	// Source says which labels found it ("" when named on the command line).
	Source string
	// Image is the controller container's image; Version its release tag ("" when it has
	// none), or the executor image's when the controller's has none.
	Image, Version string
	// ServiceAccount is the user the controller runs as, the guard's expectedRequester.
	ServiceAccount string
	// WriteBack is INFORMER_WRITE_BACK: "true", "false", "" (unset) or "from <source>" when
	// it comes from a ConfigMap or Secret the command does not read.
	WriteBack string
	// NoLeaderElection is LEADER_ELECTION_DISABLE=true.
	NoLeaderElection bool
	// Strategy is the Deployment's rollout strategy; Replicas its replicas.
	Strategy appsv1.DeploymentStrategyType
	Replicas int32
	// KFP is the Kubeflow Pipelines release that bundles this Argo ("" when it is not KFP's;
	// "an unknown release" when its install ConfigMap could not be read); KFPNote says why
	// it could not be.
	KFP, KFPNote string
}

// Requester is the user the controller runs as, as guard.expectedRequester wants it.
func (c Controller) Requester() string {
	sa := c.ServiceAccount
	if sa == "" {
		sa = "default"
	}
	return "system:serviceaccount:" + c.Namespace + ":" + sa
}

// Verdict is what the command says of a controller.
type Verdict string

// The verdicts: the controller sends what the guard refuses, it does not, or what it reads
// cannot say.
const (
	Affected    Verdict = "AFFECTED"
	NotAffected Verdict = "not affected"
	CannotTell  Verdict = "cannot tell"
)

// Finding is a controller and what is said of it: the verdict, its reasons, and the fixes
// upstream offers.
type Finding struct {
	Controller
	Verdict Verdict
	Why     []string
	Fix     []string
}

// Find lists the workflow controllers in namespace ("" for all namespaces): the Deployments
// whose pods carry an installer's labels. Upstream's install.yaml labels only the pods, so the
// pod template is read, not the Deployment's own labels.
func Find(ctx context.Context, c client.Reader, namespace string) ([]Controller, error) {
	var list appsv1.DeploymentList
	if err := c.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return nil, fmt.Errorf("listing Deployments: %w", err)
	}
	var out []Controller
	for i := range list.Items {
		d := &list.Items[i]
		source := sourceOf(d.Spec.Template.Labels)
		if source == "" {
			continue
		}
		ctl := Read(d)
		ctl.Source = source
		out = append(out, ctl)
	}
	for i := range out {
		out[i].KFP, out[i].KFPNote = kfpOf(ctx, c, out[i].Namespace, out[i].KFP)
	}
	slices.SortFunc(out, func(a, b Controller) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out, nil
}

// sourceOf is the installer whose labels a pod template carries, or "".
func sourceOf(labels map[string]string) string {
	for _, s := range Selectors {
		match := true
		for k, v := range s.Labels {
			if labels[k] != v {
				match = false
			}
		}
		if match {
			return s.Source
		}
	}
	return ""
}

// Get reads the one Deployment named (a get, no list right needed).
func Get(ctx context.Context, c client.Reader, namespace, name string) (Controller, error) {
	var d appsv1.Deployment
	if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, &d); err != nil {
		return Controller{}, fmt.Errorf("reading Deployment %s/%s: %w", namespace, name, err)
	}
	ctl := Read(&d)
	ctl.KFP, ctl.KFPNote = kfpOf(ctx, c, ctl.Namespace, ctl.KFP)
	return ctl, nil
}

// kfpOf reads Kubeflow Pipelines' install ConfigMap beside a controller: its release when it
// is there, labelled says the Deployment carries KFP's label.
func kfpOf(ctx context.Context, c client.Reader, namespace, labelled string) (kfp, note string) {
	var cm corev1.ConfigMap
	err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: kfpConfig}, &cm)
	switch {
	case err == nil && cm.Data["appVersion"] != "":
		return cm.Data["appVersion"], ""
	case err == nil:
		return "an unknown release", "its ConfigMap " + kfpConfig + " names no appVersion"
	case apierrors.IsNotFound(err):
		return labelled, ""
	default:
		if labelled != "" {
			return labelled, fmt.Sprintf("its ConfigMap %s could not be read: %v", kfpConfig, err)
		}
		return "", fmt.Sprintf("whether Kubeflow Pipelines bundles it is not known: its ConfigMap %s could not be read: %v", kfpConfig, err)
	}
}

// Read is what a controller's Deployment says.
func Read(d *appsv1.Deployment) Controller {
	ctl := Controller{Namespace: d.Namespace, Name: d.Name, ServiceAccount: d.Spec.Template.Spec.ServiceAccountName,
		Strategy: d.Spec.Strategy.Type, Replicas: 1}
	if ctl.Strategy == "" {
		ctl.Strategy = appsv1.RollingUpdateDeploymentStrategyType // the API server's default
	}
	if d.Spec.Replicas != nil {
		ctl.Replicas = *d.Spec.Replicas
	}
	if d.Labels[kfpLabel] == kfpValue || d.Spec.Template.Labels[kfpLabel] == kfpValue {
		ctl.KFP = "an unknown release"
	}
	c := controllerContainer(d.Spec.Template.Spec.Containers)
	if c == nil {
		return ctl
	}
	ctl.Image = c.Image
	ctl.Version = argorelease.ImageTag(c.Image)
	if _, _, _, ok := argorelease.Release(ctl.Version); !ok {
		if exec := executorImage(c.Args); exec != "" {
			if tag := argorelease.ImageTag(exec); tag != "" {
				if _, _, _, ok := argorelease.Release(tag); ok {
					ctl.Version = tag
				}
			}
		}
	}
	for _, e := range c.Env {
		switch e.Name {
		case "INFORMER_WRITE_BACK":
			if e.ValueFrom != nil {
				ctl.WriteBack = "from " + valueSource(e.ValueFrom)
			} else {
				ctl.WriteBack = strconv.FormatBool(isTrue(e.Value))
			}
		case "LEADER_ELECTION_DISABLE":
			ctl.NoLeaderElection = e.ValueFrom == nil && isTrue(e.Value)
		}
	}
	return ctl
}

// isTrue reads an environment variable as Argo's controller does (strconv.ParseBool).
func isTrue(v string) bool {
	b, err := strconv.ParseBool(v)
	return err == nil && b
}

func valueSource(v *corev1.EnvVarSource) string {
	switch {
	case v.ConfigMapKeyRef != nil:
		return "ConfigMap " + v.ConfigMapKeyRef.Name
	case v.SecretKeyRef != nil:
		return "Secret " + v.SecretKeyRef.Name
	default:
		return "a field of the pod"
	}
}

// controllerContainer is the container that runs workflow-controller: the one whose command
// is it, else whose image is it, else the first.
func controllerContainer(cs []corev1.Container) *corev1.Container {
	for i := range cs {
		if len(cs[i].Command) > 0 && base(cs[i].Command[0]) == "workflow-controller" {
			return &cs[i]
		}
	}
	for i := range cs {
		image, _, _ := strings.Cut(cs[i].Image, "@")
		if repo, _, _ := strings.Cut(base(image), ":"); repo == "workflow-controller" {
			return &cs[i]
		}
	}
	if len(cs) > 0 {
		return &cs[0]
	}
	return nil
}

func base(p string) string { return p[strings.LastIndex(p, "/")+1:] }

// executorImage is the value of --executor-image in the controller's arguments.
func executorImage(args []string) string {
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--executor-image="); ok {
			return v
		}
		if a == "--executor-image" && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// Judge says whether a controller sends what exit-guard refuses, why, and what upstream offers.
func Judge(c Controller) Finding {
	f := Finding{Controller: c, Verdict: NotAffected}
	affected := func(why string, fix ...string) {
		f.Verdict = Affected
		f.Why = append(f.Why, why)
		f.Fix = append(f.Fix, fix...)
	}
	cannotTell := func(why string, fix ...string) {
		if f.Verdict != Affected {
			f.Verdict = CannotTell
		}
		f.Why = append(f.Why, why)
		f.Fix = append(f.Fix, fix...)
	}
	release := "Argo Workflows " + c.Version
	switch e := argorelease.Of(c.Version); e {
	case argorelease.Unknown:
		cannotTell(fmt.Sprintf("the controller's image %q names no release", c.Image),
			"compare your controller's version with the README's Am I affected?")
	case argorelease.Exposed, argorelease.Older:
		affected(release+" has no fix for stale passes: a stale copy of a completed workflow runs its exit handler again (README, Am I affected?)",
			"upgrade Argo to "+argorelease.FixedIn(c.Version)+"; until then install exit-guard")
	case argorelease.WriteBack:
		switch {
		case c.WriteBack == "true":
			affected(release+" with INFORMER_WRITE_BACK=true sends stale passes as 3.x does",
				"upgrade Argo to "+argorelease.FixedIn(c.Version)+", or remove INFORMER_WRITE_BACK; until then install exit-guard")
		case strings.HasPrefix(c.WriteBack, "from "):
			cannotTell(release+" sends stale passes only with INFORMER_WRITE_BACK=true, which comes "+c.WriteBack,
				"read that value: true means affected (upgrade to "+argorelease.FixedIn(c.Version)+")")
		default:
			f.Why = append(f.Why, release+" without INFORMER_WRITE_BACK=true writes no stale copy into its cache (4.0's default)")
		}
	case argorelease.Fixed:
		f.Why = append(f.Why, release+" carries upstream's fix (argo-workflows#16357)")
	}
	if c.NoLeaderElection && (c.Replicas > 1 || c.Strategy != appsv1.RecreateDeploymentStrategyType) {
		how := fmt.Sprintf("%d replicas", c.Replicas)
		if c.Replicas <= 1 {
			how = "a " + string(c.Strategy) + " rollout, which starts the new controller before the old one is gone"
		}
		affected("LEADER_ELECTION_DISABLE=true with "+how+": two controllers run at once and send late exit handlers on any release (argo-workflows#16034)",
			"run one replica with strategy Recreate, or remove LEADER_ELECTION_DISABLE so that leader election keeps one controller working")
	}
	if c.KFP != "" {
		f.Why = append(f.Why, "this Argo is the one Kubeflow Pipelines "+c.KFP+" bundles: upgrading it means a Kubeflow Pipelines release that bundles a fixed Argo")
		if f.Verdict == Affected {
			f.Fix = append(f.Fix, "with Kubeflow Pipelines, install exit-guard beside the bundled Argo rather than replace it")
		}
	}
	if c.KFPNote != "" {
		f.Why = append(f.Why, c.KFPNote)
	}
	return f
}

// Exit codes of the command: scripts can test them.
const (
	ExitNotAffected = 0
	ExitAffected    = 1
	ExitError       = 2
	ExitCannotTell  = 3
)

// Code is the exit status of a set of findings: affected if any is, else cannot tell if any is
// or none was found, else not affected.
func Code(fs []Finding) int {
	code := ExitNotAffected
	if len(fs) == 0 {
		code = ExitCannotTell
	}
	for _, f := range fs {
		switch f.Verdict {
		case Affected:
			return ExitAffected
		case CannotTell:
			code = ExitCannotTell
		}
	}
	return code
}

// Report is the findings for a person: a paragraph per controller, then what they mean.
func Report(fs []Finding, namespace string) string {
	var b strings.Builder
	w := &b
	if len(fs) == 0 {
		where := "any namespace"
		if namespace != "" {
			where = "namespace " + namespace
		}
		_, _ = fmt.Fprintf(w, "No Argo Workflows controller found in %s: no Deployment whose pods are labelled app=workflow-controller (upstream's install.yaml, Kubeflow Pipelines) or app.kubernetes.io/component=workflow-controller (the argo-workflows chart). Name yours with --controller=namespace/name.\n", where)
		return b.String()
	}
	for _, f := range fs {
		_, _ = fmt.Fprintf(w, "%s/%s: %s\n", f.Namespace, f.Name, f.Verdict)
		version := f.Version
		if version == "" {
			version = "no release tag"
		}
		_, _ = fmt.Fprintf(w, "  controller: image %s (%s), %d replica(s), strategy %s", f.Image, version, f.Replicas, f.Strategy)
		if f.WriteBack != "" {
			_, _ = fmt.Fprintf(w, ", INFORMER_WRITE_BACK %s", f.WriteBack)
		}
		if f.NoLeaderElection {
			_, _ = fmt.Fprint(w, ", LEADER_ELECTION_DISABLE=true")
		}
		b.WriteString("\n")
		if f.Source != "" {
			_, _ = fmt.Fprintf(w, "  found by: %s\n", f.Source)
		}
		for _, why := range f.Why {
			_, _ = fmt.Fprintf(w, "  why: %s\n", why)
		}
		for _, fix := range f.Fix {
			_, _ = fmt.Fprintf(w, "  fix: %s\n", fix)
		}
		if f.Verdict != NotAffected {
			_, _ = fmt.Fprintf(w, "  if you install exit-guard: guard.expectedRequester=%s\n", f.Requester())
		}
	}
	switch Code(fs) {
	case ExitAffected:
		_, _ = fmt.Fprintln(w, "Verdict: affected. A controller above sends false exit handlers; exit-guard refuses them (README, Install).")
	case ExitCannotTell:
		_, _ = fmt.Fprintln(w, "Verdict: cannot tell for a controller above; none is known to be affected.")
	default:
		_, _ = fmt.Fprintln(w, "Verdict: not affected. No controller above sends what exit-guard refuses: you do not need it.")
	}
	return b.String()
}
