package webhook

import (
	"context"
	"errors"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exit-guard/exit-guard/completionstore"
	"github.com/exit-guard/exit-guard/contract"
	"github.com/exit-guard/exit-guard/internal/argo"
	"github.com/exit-guard/exit-guard/test/support/fixture"
)

// decisionCase is one case of TestDecisionTable: the object, the options, what the live read
// answers and the store holds, and the decision wanted. Each kind gives the cases of its rows
// (kindTest.cases).
type decisionCase struct {
	// row is the row of docs/decisions.md the case is about, and name what it shows.
	row, name string
	facts     func(t *testing.T) facts
	opts      Options
	live      liveAnswer
	store     storeState
	// staleWatch: the guard's watch has not advanced for longer than WatchStaleAfter (and
	// than StoreFreshFor).
	staleWatch bool
	// prepare, when set, readies the guard for a kind's own rows (what it remembers, its
	// further reads) before it decides, and returns a check of what it saw, run after.
	prepare func(t *testing.T, g *guard, f facts) (check func(t *testing.T))
	// The decision wanted; wantRow is the row that answers (row, unless the case's row sends
	// the object on to another).
	deny    bool
	reason  contract.Reason
	source  source
	wantRow string
}

// decisionCases are every kind's cases, kind after kind in the order of kinds.
func decisionCases(t testing.TB) []decisionCase {
	var cases []decisionCase
	for _, k := range kinds {
		cases = append(cases, testOf(t, k).cases()...)
	}
	return cases
}

// TestDecisionTable checks every row of docs/decisions.md, in its order, on the facts the
// webhooks read from requests, with a live read that answers as each case says. The rows that
// are about the API server itself (what a live read sees, how it fails) are checked through a
// real one by TestLiveReadThroughTheAPIServer.
func TestDecisionTable(t *testing.T) {
	// seen are the (kind, reason) pairs the rows give: each kind's declared reasons (its metric
	// series) must be exactly those.
	seen := map[objectKind]map[contract.Reason]bool{}
	ran := 0
	cases := decisionCases(t)
	for _, c := range cases {
		t.Run(c.row+" "+c.name, func(t *testing.T) {
			ran++
			g, err := newGuard(nil, storeFor(t, tableWorkflow, c.store, c.staleWatch), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			calls, nodeCalls := 0, 0
			g.readLive = cannedRead(c.live, &calls)
			g.readNodes = cannedNodes(nodesNone, nil, &nodeCalls)
			f := c.facts(t)
			check := func(*testing.T) {
				if nodeCalls > 0 {
					t.Errorf("whole read of the name's holder made %d times; the case wants none", nodeCalls)
				}
			}
			if c.prepare != nil {
				check = c.prepare(t, g, f)
			}
			d := g.decide(t.Context(), f)
			spec := f.object.spec()
			if seen[spec.kind] == nil {
				seen[spec.kind] = map[contract.Reason]bool{}
			}
			seen[spec.kind][d.reason] = true
			declared := spec.admissions
			if d.deny {
				declared = spec.refusals
			}
			if !slices.Contains(declared, d.reason) {
				t.Errorf("a %s decided deny %v for %s, which its kindSpec does not declare: no metric series starts at 0 for it", spec.kind, d.deny, d.reason)
			}
			wantRow := c.wantRow
			if wantRow == "" {
				wantRow = c.row
			}
			if d.deny != c.deny || d.reason != c.reason || d.source != c.source || d.row != wantRow {
				t.Errorf("decision = deny %v reason %s source %q row %s, want deny %v reason %s source %q row %s (live error: %v)",
					d.deny, d.reason, d.source, d.row, c.deny, c.reason, c.source, wantRow, d.liveErr)
			}
			if made := calls > 0; made != (c.live != liveNone) {
				t.Errorf("live read made %d times; the case wants it made: %v", calls, c.live != liveNone)
			}
			if check != nil {
				check(t)
			}
		})
	}
	if ran < len(cases) {
		t.Logf("%d of %d rows ran (-run): the declared reasons are checked against the whole table only", ran, len(cases))
		return
	}
	for _, k := range kinds {
		for _, r := range slices.Concat(k.refusals, k.admissions) {
			if !seen[k.kind][r] {
				t.Errorf("%s declares %s, which no row of the table gives it: a metric series that can never move", k.kind, r)
			}
		}
	}
}

// TestDecisionTableWalksTheDocInOrder: every row of each kind's tables (in docs/decisions.md,
// or the doc its kindTest names) has a case, the cases come in the rows' order, every row a
// decision names is in a doc, and every row of docs/decisions.md belongs to a kind: its name is
// a kind's rowPrefix and a number.
func TestDecisionTableWalksTheDocInOrder(t *testing.T) {
	docs := map[string]string{}
	var allRows []string
	for _, k := range kinds {
		kt := testOf(t, k)
		if _, ok := docs[kt.doc]; !ok {
			raw, err := os.ReadFile(kt.doc)
			if err != nil {
				t.Fatal(err)
			}
			docs[kt.doc] = string(raw)
		}
		var docRows []string
		for _, m := range regexp.MustCompile(`(?m)^\| (`+regexp.QuoteMeta(k.rowPrefix)+`[0-9]+) \|`).FindAllStringSubmatch(docs[kt.doc], -1) {
			docRows = append(docRows, m[1])
		}
		if len(docRows) == 0 {
			t.Errorf("%s has no row of kind %s (a table row | %s1 | ...)", kt.doc, k.kind, k.rowPrefix)
		}
		allRows = append(allRows, docRows...)
		var caseRows []string
		for _, c := range kt.cases() {
			if len(caseRows) == 0 || caseRows[len(caseRows)-1] != c.row {
				caseRows = append(caseRows, c.row)
			}
		}
		if strings.Join(caseRows, " ") != strings.Join(docRows, " ") {
			t.Errorf("the cases of kind %s walk rows\n  %s\nand %s has\n  %s", k.kind, strings.Join(caseRows, " "), kt.doc, strings.Join(docRows, " "))
		}
	}
	for _, c := range decisionCases(t) {
		if c.wantRow != "" && !slices.Contains(allRows, c.wantRow) {
			t.Errorf("case %q answers by row %s, which no kind's doc has", c.name, c.wantRow)
		}
	}
	var prefixes []string
	for _, k := range kinds {
		prefixes = append(prefixes, regexp.QuoteMeta(k.rowPrefix))
	}
	rowOfAKind := regexp.MustCompile(`^(` + strings.Join(prefixes, "|") + `)[0-9]+$`)
	for _, m := range regexp.MustCompile(`(?m)^\| ([A-Z]*[0-9]+) \|`).FindAllStringSubmatch(docs["../docs/decisions.md"], -1) {
		if !rowOfAKind.MatchString(m[1]) {
			t.Errorf("docs/decisions.md has row %s, of no kind's rowPrefix", m[1])
		}
	}
}

// TestEachRoleReadsWithinItsBudget: the pods a workflow sends many of, one after another in one
// pass of Argo's controller (hooks at every level, and steps once the guard's watch is stale),
// read their workflow within --hook-step-read-budget; exit-handler and agent pods (one or two a
// workflow) and TaskSet writes within --live-read-budget; Events within --event-read-budget. A
// pod a node name alone cannot tell from a hook (under a DAG task named "hooks") gets the short
// budget either way.
func TestEachRoleReadsWithinItsBudget(t *testing.T) {
	wf := tableWorkflow
	dagTaskNamedHooks := fixture.Pod(wf, wf.GetName()+"-build", wf.GetName()+".hooks.build")
	stepHook := fixture.Pod(wf, wf.GetName()+"-step-hook", wf.GetName()+"[0].work.hooks.failed")
	underHook := fixture.Pod(wf, wf.GetName()+"-under-hook", wf.GetName()+".hooks.failed[0].notify")
	def := DefaultOptions()
	for _, c := range []struct {
		name       string
		facts      func(t *testing.T) facts
		staleWatch bool
		want       time.Duration
	}{
		{"an exit-handler pod", func(t *testing.T) facts { return podFacts(t, fixture.ExitPod(wf)) }, false, def.LiveReadBudget},
		{"an agent pod", func(t *testing.T) facts { return podFacts(t, fixture.AgentPod(wf)) }, false, def.LiveReadBudget},
		{"a workflow-level hook pod", func(t *testing.T) facts { return podFacts(t, fixture.HookPod(wf)) }, false, def.HookStepReadBudget},
		{"a step-level hook pod", func(t *testing.T) facts { return podFacts(t, stepHook) }, false, def.HookStepReadBudget},
		{"a pod of a step under a hook", func(t *testing.T) facts { return podFacts(t, underHook) }, false, def.HookStepReadBudget},
		{"a pod under a DAG task named hooks", func(t *testing.T) facts { return podFacts(t, dagTaskNamedHooks) }, false, def.HookStepReadBudget},
		{"a step pod, the watch stale", func(t *testing.T) facts { return podFacts(t, fixture.StepPod(wf)) }, true, def.HookStepReadBudget},
		{"a TaskSet write", func(t *testing.T) facts {
			return taskSetFacts(t, wf, []string{}, "true", []string{argo.NodeID(wf.GetName(), argo.OnExitNodeName(wf.GetName()))}, "false")
		}, false, def.LiveReadBudget},
		{"a failure Event", func(t *testing.T) facts { return eventFacts(t, wf, argo.EventReasonWorkflowFailed) }, false, def.EventReadBudget},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, err := newGuard(nil, storeFor(t, wf, storeRunning, c.staleWatch), Options{})
			if err != nil {
				t.Fatal(err)
			}
			var budgets []time.Duration
			g.readLive = func(_ context.Context, _, _ string, p readPolicy) (*argo.Workflow, error) {
				budgets = append(budgets, p.budget)
				if p.attempt > p.budget {
					t.Errorf("an attempt of %s in a budget of %s", p.attempt, p.budget)
				}
				return nil, errors.Join(errLiveReadTimeout, context.DeadlineExceeded)
			}
			g.decide(t.Context(), c.facts(t))
			if len(budgets) != 1 || budgets[0] != c.want {
				t.Errorf("live reads within %v, want one within %v", budgets, c.want)
			}
		})
	}
}

// TestStoreFirstTrustsOnlyTheWatchOfTheStepsNamespace: with a watch per namespace
// (--namespaces), a step pod is decided from the store only while its own namespace's watch is
// fresh: another namespace's events say nothing of it (row 19 otherwise).
func TestStoreFirstTrustsOnlyTheWatchOfTheStepsNamespace(t *testing.T) {
	wf := tableWorkflow
	for _, c := range []struct {
		name     string
		advanced string // the namespace whose watch just advanced
		wantRead bool
	}{
		{"the step's namespace advanced", wf.GetNamespace(), false},
		{"only another namespace advanced", "another", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			store, clk := fakeClockStore(t)
			store.SetWatchPerNamespace(true)
			store.ProgressIn(wf.GetNamespace(), "1")
			clk.Step(time.Hour)
			store.ProgressIn(c.advanced, "2")
			store.Observe(completionstore.Observation{UID: wf.GetUID(), Namespace: wf.GetNamespace(), Name: wf.GetName(), ResourceVersion: "1", Phase: argo.PhaseRunning})
			g, err := newGuard(nil, store, Options{Namespaces: []string{wf.GetNamespace(), "another"}})
			if err != nil {
				t.Fatal(err)
			}
			calls := 0
			g.readLive = cannedRead(liveRunning, &calls)
			d := g.decide(t.Context(), podFacts(t, fixture.StepPod(wf)))
			if read := calls > 0; read != c.wantRead || d.deny {
				t.Errorf("live read made: %v (want %v), decision deny %v row %s", read, c.wantRead, d.deny, d.row)
			}
		})
	}
}
