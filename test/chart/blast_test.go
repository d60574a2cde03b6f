//go:build envtest

package chart

import (
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

// TestTheBlastRadiusIsTheChartsRender holds docs/install.md's blast-radius table to the chart:
// for each row, the webhook its kind reaches (pods for each guard.cover, TaskSets, Events) has
// exactly the match conditions the row names, in the default render, failing open.
func TestTheBlastRadiusIsTheChartsRender(t *testing.T) {
	table := docTable(t, "docs/install.md", "blast-radius")
	cover := regexp.MustCompile("`guard\\.cover=([a-z,-]+)`")
	name := regexp.MustCompile("`([a-z-]+)`")
	rows := 0
	for _, line := range table {
		cells := strings.Split(line, " | ")
		if len(cells) != 4 || strings.HasPrefix(line, "| ---") || strings.HasPrefix(line, "| what |") {
			continue
		}
		rows++
		what := strings.TrimPrefix(cells[0], "| ")
		var want []string
		for _, m := range name.FindAllStringSubmatch(cells[2], -1) {
			want = append(want, m[1])
		}
		var set []string
		webhook := ""
		switch {
		case strings.HasPrefix(what, "pods"):
			m := cover.FindStringSubmatch(what)
			if m == nil {
				t.Errorf("%s: no guard.cover", what)
				continue
			}
			set, webhook = []string{"guard.cover=" + strings.ReplaceAll(m[1], ",", `\,`)}, "validate.exit-guard.io"
		case strings.Contains(what, "WorkflowTaskSet"):
			webhook = "validate-taskset.exit-guard.io"
		case strings.HasPrefix(what, "Events"):
			webhook = "validate-event.exit-guard.io"
		default:
			t.Errorf("a row the test does not know: %s", what)
			continue
		}
		objs := render(t, profile{name: "blast", set: set}, "exit-guard", "argo")
		cfg := convert[admissionregistrationv1.ValidatingWebhookConfiguration](t, only(t, objs, "ValidatingWebhookConfiguration"))
		i := slices.IndexFunc(cfg.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == webhook })
		if i < 0 {
			t.Errorf("%s: the chart renders no webhook %s", what, webhook)
			continue
		}
		w := cfg.Webhooks[i]
		var got []string
		for _, c := range w.MatchConditions {
			got = append(got, c.Name)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: the table names the match conditions %v, the chart renders %v", what, want, got)
		}
		if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
			t.Errorf("%s: failurePolicy %v, the page says it fails open", what, w.FailurePolicy)
		}
	}
	if rows != 6 {
		t.Errorf("the test read %d rows of the table, want 6", rows)
	}
}
