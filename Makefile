# exit-guard: build, test and verify. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
comma := ,
.SHELLFLAGS := -ec

GO ?= go
BIN := $(CURDIR)/bin
# Every version, written once (the tests and hack/ read the same file).
include hack/versions.env
# Tools are built from Go modules at pinned versions into the user cache, as hack/ does for the
# API server and Argo (EXIT_GUARD_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/exit-guard), named by
# version: every checkout and worktree of the machine shares them, so a fresh one builds none.
CACHE_ROOT := $(or $(EXIT_GUARD_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/exit-guard)
TOOLS := $(CACHE_ROOT)/tools
GOLANGCI_LINT := $(TOOLS)/golangci-lint-$(GOLANGCI_LINT_VERSION)
HELM := $(TOOLS)/helm-$(HELM_VERSION)
HELM3 := $(TOOLS)/helm-$(HELM3_VERSION)
CONTROLLER_GEN := $(TOOLS)/controller-gen-$(CONTROLLER_GEN_VERSION)
HELM_DOCS := $(TOOLS)/helm-docs-$(HELM_DOCS_VERSION)
PROMTOOL := $(TOOLS)/promtool-$(PROMTOOL_VERSION)
COSIGN := $(TOOLS)/cosign-$(COSIGN_VERSION)
SYFT := $(TOOLS)/syft-$(SYFT_VERSION)
ACTIONLINT := $(TOOLS)/actionlint-$(ACTIONLINT_VERSION)
CHART := charts/exit-guard
# Options for `go test`, e.g. GOTESTFLAGS='-run TestX -v'.
GOTESTFLAGS ?=

.DEFAULT_GOAL := help

##@ General

.PHONY: help
help: ## Show this help, by purpose.
	@awk 'BEGIN {FS = ":.*## "} /^##@ / {printf "\n%s\n", substr($$0, 5)} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Build

# The version is the chart's appVersion (one source); the commit and date are the checkout's.
# --version prints the three.
VERSION ?= $(shell sed -n 's/^appVersion: *"\(.*\)"/\1/p' $(CHART)/Chart.yaml)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
BUILD_DATE ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
VERSION_LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(BUILD_DATE)

.PHONY: build
build: ## Build the exit-guard binary into ./bin (exit-guard --version names its version and commit).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/exit-guard .

# The image `make image` builds and `make image-push` pushes (a registry/repository:tag you can
# write to), and its platforms.
IMAGE ?= ghcr.io/exit-guard/exit-guard:$(VERSION)
IMAGE_ARCHS ?= amd64 arm64

.PHONY: image
image: ## Build the container image without a container engine (hack/image) into the OCI layout bin/image, for IMAGE_ARCHS.
	$(GO) run ./hack/image build --out $(BIN)/image --tag $(IMAGE) --version $(VERSION) --ldflags "$(VERSION_LDFLAGS)" $(addprefix --arch ,$(IMAGE_ARCHS))

.PHONY: image-push
image-push: image ## Push bin/image to IMAGE (credentials from docker login or your registry's credential helper).
	$(GO) run ./hack/image push --layout $(BIN)/image --to $(IMAGE)

##@ Release

RELEASE_TOOLS := $(HELM) $(COSIGN) $(SYFT)
RELEASE_ENV = GO="$(GO)" HELM="$(HELM)" COSIGN="$(COSIGN)" SYFT="$(SYFT)" DIST="$(BIN)/release"

.PHONY: release-tools
release-tools: $(RELEASE_TOOLS) $(ACTIONLINT) ## Build the release's tools (helm, cosign, syft, actionlint; pinned, from Go modules) into the user cache.

.PHONY: release-snapshot
release-snapshot: $(RELEASE_TOOLS) ## The release workflow's steps, here: binaries, multi-arch image, SBOMs, chart, pushed to a loopback registry, signed with a key made for the run, verified (bin/release).
	@mkdir -p $(BIN)
	@rm -f $(BIN)/registry.addr
	@$(GO) build -o $(BIN)/registry ./hack/registry
	@$(BIN)/registry --addr-file $(BIN)/registry.addr & pid=$$!; trap "kill $$pid" EXIT; \
	  for i in $$(seq 50); do test -s $(BIN)/registry.addr && break; sleep 0.1; done; \
	  SNAPSHOT_REGISTRY=$$(cat $(BIN)/registry.addr) $(RELEASE_ENV) hack/release.sh snapshot

.PHONY: test-release
test-release: $(RELEASE_TOOLS) ## Run hack/release.sh snapshot against a registry in the test and check the image, SBOMs, signatures and chart it publishes (test/release).
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" COSIGN="$(COSIGN)" SYFT="$(SYFT)" $(GO) test -tags release -count=1 $(GOTESTFLAGS) ./test/release

.PHONY: release
release: $(RELEASE_TOOLS) ## Publish a release (the release workflow runs it on a tag v<appVersion>; RELEASE_TAG is the tag).
	$(RELEASE_ENV) RELEASE_TAG="$(RELEASE_TAG)" hack/release.sh publish

.PHONY: actionlint
actionlint: $(ACTIONLINT) ## Check the GitHub Actions workflows (actionlint, pinned, from Go modules).
	$(ACTIONLINT) -no-color -shellcheck= -pyflakes=

$(COSIGN):
	@mkdir -p $(TOOLS)
	@echo "building cosign $(COSIGN_VERSION) into the user cache from Go modules (several minutes the first time)"
	tmp=$$(mktemp -d $(TOOLS)/.cosign-XXXXXX) && CGO_ENABLED=0 GOBIN=$$tmp $(GO) install -trimpath github.com/sigstore/cosign/v2/cmd/cosign@$(COSIGN_VERSION) && \
	  mv $$tmp/cosign $@ && rmdir $$tmp

$(SYFT):
	@mkdir -p $(TOOLS)
	@echo "building syft $(SYFT_VERSION) into the user cache from Go modules (several minutes the first time)"
	tmp=$$(mktemp -d $(TOOLS)/.syft-XXXXXX) && CGO_ENABLED=0 GOBIN=$$tmp $(GO) install -trimpath github.com/anchore/syft/cmd/syft@$(SYFT_VERSION) && \
	  mv $$tmp/syft $@ && rmdir $$tmp

$(ACTIONLINT):
	@mkdir -p $(TOOLS)
	tmp=$$(mktemp -d $(TOOLS)/.actionlint-XXXXXX) && GOBIN=$$tmp $(GO) install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION) && \
	  mv $$tmp/actionlint $@ && rmdir $$tmp

##@ Run

.PHONY: demo
demo: build ## Replay the reference scenario: local API server, the guard, a stale exit handler refused.
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" $(GO) run ./test/demo --guard $(BIN)/exit-guard

##@ Test

.PHONY: promtool
promtool: $(PROMTOOL) ## Build promtool (pinned, from Go modules) into the user cache.

.PHONY: envtest-binaries
envtest-binaries: ## Build kube-apiserver and etcd from Go modules into the user cache (first run ~10 min).
	@hack/envtest-binaries.sh ensure

# The tests that need a kube-apiserver are behind the envtest build tag: make test builds with
# it and runs every test; make test-unit builds without it and runs the rest, starting no API
# server (the packages whose TestMain starts one have no test files there).
.PHONY: test
test: $(HELM) $(PROMTOOL) ## Run every test with the race detector against a real kube-apiserver (builds it, kubectl, helm and promtool if missing).
	@assets=$$(hack/envtest-binaries.sh ensure-kubectl) && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" PROMTOOL="$(PROMTOOL)" $(GO) test -tags envtest -race -count=1 $(GOTESTFLAGS) ./...

.PHONY: test-unit
test-unit: $(HELM) ## Run the tests that need no API server, in seconds (-short: the simulation runs a tenth of its histories).
	HELM="$(HELM)" $(GO) test -short -count=1 $(GOTESTFLAGS) ./...

# Histories of the randomized simulation in make soak (make test runs 3,000).
SOAK_HISTORIES ?= 100000

.PHONY: soak
soak: $(HELM) ## The randomized simulation at length (SOAK_HISTORIES histories) and the fault tests; writes docs/evidence/reliability-simulation.md.
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  $(GO) test -count=1 -timeout 3h -run '^TestSimulation$$' -v ./webhook \
	    -args -sim.histories=$(SOAK_HISTORIES) -sim.report=$(CURDIR)/docs/evidence/reliability-simulation.md && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" $(GO) test -tags envtest -count=3 -timeout 1h -v ./test/faults

# Pod creates per role and workflow in make waits (make test runs 4).
WAITS_PER_ROLE ?= 100

.PHONY: waits
waits: ## How long each role's pod waits on the guard with its watch stale and every live read hanging (WAITS_PER_ROLE creates each); writes docs/evidence/waits.md.
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" $(GO) test -tags envtest -count=1 -timeout 1h -v -run '^TestEachRoleWaitsWithinItsBudgetWhileReadsHang$$' ./webhook \
	    -args -waits.n=$(WAITS_PER_ROLE) -waits.report=$(CURDIR)/docs/evidence/waits.md

# Decisions per run of make overload (make test runs 400), and the role of their pods.
OVERLOAD_DECISIONS ?= 5000
OVERLOAD_POD_ROLE ?= exit-handler

.PHONY: overload
overload: $(HELM) ## The guard's live reads beside a flood that API Priority and Fairness queues past their budget, without and with the chart's FlowSchema (OVERLOAD_DECISIONS per run, OVERLOAD_POD_ROLE: exit-handler, lifecycle-hook or step).
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" OVERLOAD_DECISIONS=$(OVERLOAD_DECISIONS) OVERLOAD_POD_ROLE=$(OVERLOAD_POD_ROLE) \
	  $(GO) test -tags envtest -count=1 -timeout 3h -v -run '^TestLiveReadsUnderPriorityAndFairness$$' ./test/faults

# How long make fuzz runs each fuzz target.
FUZZTIME ?= 60s

.PHONY: fuzz
fuzz: ## Run each fuzz target of webhook/ (AdmissionReview on every path of every kind, each kind's reader) for FUZZTIME (seeds: each kind's, and webhook/testdata/argo-pods).
	@targets=$$($(GO) test ./webhook -list '^Fuzz' | grep '^Fuzz') || exit 1; \
	for target in $$targets; do \
	  echo "== $$target ($(FUZZTIME))"; \
	  $(GO) test ./webhook -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 3s || exit 1; \
	done

# make load's scenarios, and the retained workflows of its start-up run and their sizes
# (docs/evidence/performance.md has the runs at 10,000 and 100,000).
LOAD_SCENARIOS ?= apiserver roles webhook startup watch
# The retained workflows at each step of the roles run (each role's writes through the API server).
LOAD_ROLES_RETAINED ?= 0,10000,100000
LOAD_WORKFLOWS ?= 10000
LOAD_SIZE_KB ?= 32
LOAD_LARGE_KB ?= 300
LOAD_LARGE_EVERY ?= 100
# Where make load draws its plots (docs/evidence/performance.md shows them).
LOAD_PLOTS ?= docs/img
# Back-to-back restarts in the start-up run: LOAD_ROUNDS rounds, each restarting this guard and,
# with LOAD_COMPARE (a commit), the guard of that commit (built into bin/ from a worktree), in a
# random order, beside a timed metadata LIST of the same workflows.
LOAD_ROUNDS ?= 0
LOAD_COMPARE ?=
LOAD_COMPARE_BIN := $(if $(LOAD_COMPARE),$(BIN)/exit-guard-$(LOAD_COMPARE))

##@ Measure

.PHONY: load
load: build $(HELM) $(LOAD_COMPARE_BIN) ## Measure the guard on a local API server, loopback only, bounded (LOAD_SCENARIOS); prints Markdown tables, draws plots into LOAD_PLOTS.
	@assets=$$(hack/envtest-binaries.sh ensure) && export KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" && \
	  $(GO) build -o $(BIN)/load ./test/load && \
	  for s in $(LOAD_SCENARIOS); do \
	    case $$s in \
	      startup) args="--workflows $(LOAD_WORKFLOWS) --size-kb $(LOAD_SIZE_KB) --large-kb $(LOAD_LARGE_KB) --large-every $(LOAD_LARGE_EVERY) --plot $(LOAD_PLOTS)/load-startup-$(LOAD_WORKFLOWS).svg --rounds $(LOAD_ROUNDS) $(if $(LOAD_COMPARE),--compare $(LOAD_COMPARE_BIN))";; \
	      apiserver) args="--plot $(LOAD_PLOTS)/load-apiserver.svg";; \
	      roles) args="--retained $(LOAD_ROLES_RETAINED)";; \
	      *) args="";; \
	    esac; \
	    echo "== load $$s $$args"; \
	    $(BIN)/load $$s --guard $(BIN)/exit-guard $$args || exit 1; \
	  done

# The guard of an earlier commit, for make load's back-to-back restarts (LOAD_COMPARE).
$(BIN)/exit-guard-%:
	@dir=$$(mktemp -d) && git worktree add --detach -q "$$dir" $* && \
	  ( cd "$$dir" && $(GO) build -o $@ . ); rc=$$?; git worktree remove --force "$$dir"; exit $$rc

.PHONY: bench
bench: ## Run the benchmarks (one decision, live reads by size, the Workflow cache) against a real API server.
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" $(GO) test -tags envtest -run '^$$' -bench . -benchmem ./webhook ./completionstore

# Workflows per run of the Argo proof (make e2e-argo); CI runs fewer.
E2E_TRIES ?= 5
# The Argo versions built, and the proof's tests run (a go test -run pattern; all by default;
# write a $ as $$, or make reads it as a variable). A pattern that matches no test fails the run.
# CI builds v3.4.17 alone and runs its core proofs at requeue 1 s (about 5 minutes once built; a
# whole cold .ci/run measured 50 minutes: docs/evidence/ci.md): see .ci/run.
ARGO_VERSIONS ?= v3.4.17 v3.5.14 v3.6.18 v3.7.15 v3.7.18 v4.0.5 v4.0.7
E2E_RUN ?= .
# Where TestSignalsNoWebhookCanStop keeps the promtool tests of the series it captured (empty:
# a temporary directory); test/chart/testdata/captured holds those committed.
E2E_CAPTURE_DIR ?=
# What hack/envtest-binaries.sh builds for the proof: ensure-gc adds kube-controller-manager (its
# garbage collector, for TestReusedNameWaitsForTheGarbageCollector); CI, which does not run that
# test, passes ensure.
E2E_ASSETS ?= ensure-gc

##@ Prove on real Argo controllers

.PHONY: argo-controllers
argo-controllers: ## Build Argo's workflow-controller and argoexec (ARGO_VERSIONS) from Go modules into the user cache.
	@hack/argo-controllers.sh ensure $(ARGO_VERSIONS) >/dev/null

.PHONY: e2e-argo
e2e-argo: argo-controllers $(HELM) $(PROMTOOL) ## Reproduce the stale exit handler on real Argo controllers, then refuse it (E2E_TRIES per run).
	@assets=$$(hack/envtest-binaries.sh $(E2E_ASSETS)) && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" PROMTOOL="$(PROMTOOL)" E2E_CAPTURE_DIR="$(E2E_CAPTURE_DIR)" E2E_TRIES=$(E2E_TRIES) $(GO) test -tags e2e -count=1 -v -timeout 120m -run '$(E2E_RUN)' ./test/e2e

# The corpus run (make e2e-corpus): the Argo versions, the folder of Workflows (empty: each
# controller module's own examples/), the files to run alone (comma-separated, relative to it;
# empty: all), whether the stale runs go too (1: after the plain runs; only: alone), and where the
# report and the pods go.
CORPUS_VERSIONS ?= v3.4.17 v3.6.18 v4.0.5
CORPUS ?= @examples
CORPUS_PICK ?=
CORPUS_STALE ?= 1
CORPUS_REPORT ?= $(BIN)/corpus.md
CORPUS_PODS ?=

.PHONY: e2e-corpus
e2e-corpus: $(HELM) ## Every Workflow of CORPUS (default: Argo's own examples/) on real controllers, without and with the guard, then with a stale pass forced; writes CORPUS_REPORT.
	@hack/argo-controllers.sh ensure $(CORPUS_VERSIONS) >/dev/null
	@mkdir -p $(dir $(CORPUS_REPORT))
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" E2E_CORPUS="$(CORPUS)" E2E_CORPUS_PICK="$(CORPUS_PICK)" \
	  E2E_CORPUS_VERSIONS="$(subst $(eval) ,$(comma),$(strip $(CORPUS_VERSIONS)))" E2E_CORPUS_STALE=$(CORPUS_STALE) \
	  E2E_CORPUS_REPORT="$(abspath $(CORPUS_REPORT))" E2E_CORPUS_PODS="$(if $(CORPUS_PODS),$(abspath $(CORPUS_PODS)))" \
	  $(GO) test -tags e2e -count=1 -v -timeout 300m -run '^TestCorpus$$' ./test/e2e

# The throughput run (make e2e-throughput): Argo versions, workflows per batch, the controller's
# parallelism, rounds, loads, workflow mixes (pods, http, mixed: test/e2e/throughput_test.go) and
# configurations compared, and where the Markdown report goes.
THROUGHPUT_VERSIONS ?= v3.4.17 v4.0.5
THROUGHPUT_WORKFLOWS ?= 24
THROUGHPUT_PARALLELISM ?= 8
THROUGHPUT_ROUNDS ?= 3
THROUGHPUT_LOADS ?= idle,loaded
THROUGHPUT_MIXES ?= pods,http
THROUGHPUT_CONFIGS ?= no webhook,do-nothing webhook,exit-guard,exit-guard --store-first,exit-guard --taskset-repeats-for=-1s,live-GET peer
THROUGHPUT_REPORT ?= $(BIN)/throughput.md

.PHONY: e2e-throughput
e2e-throughput: $(HELM) $(PROMTOOL) ## Argo's own throughput with and without the guard, on the real controllers (THROUGHPUT_*), the configurations alternated over rounds; writes THROUGHPUT_REPORT.
	@hack/argo-controllers.sh ensure $(THROUGHPUT_VERSIONS) >/dev/null
	@mkdir -p $(dir $(THROUGHPUT_REPORT))
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" PROMTOOL="$(PROMTOOL)" \
	  E2E_THROUGHPUT_VERSIONS="$(subst $(eval) ,$(comma),$(strip $(THROUGHPUT_VERSIONS)))" E2E_THROUGHPUT_WORKFLOWS=$(THROUGHPUT_WORKFLOWS) \
	  E2E_THROUGHPUT_PARALLELISM=$(THROUGHPUT_PARALLELISM) E2E_THROUGHPUT_ROUNDS=$(THROUGHPUT_ROUNDS) E2E_THROUGHPUT_LOADS="$(THROUGHPUT_LOADS)" E2E_THROUGHPUT_MIXES="$(THROUGHPUT_MIXES)" \
	  E2E_THROUGHPUT_CONFIGS="$(THROUGHPUT_CONFIGS)" E2E_THROUGHPUT_REPORT="$(abspath $(THROUGHPUT_REPORT))" \
	  $(GO) test -tags e2e -count=1 -v -timeout 300m -run '^TestArgoThroughput$$' ./test/e2e

.PHONY: ops-binaries
ops-binaries: ## Build the real Prometheus and Alertmanager from Go modules into the user cache (first run a few minutes).
	@hack/ops-binaries.sh ensure

# Which tests of the day-2 suite run (go test -run), and where TestDashboardOnRealData draws
# its preview of the dashboard (empty: none).
OPS_RUN ?= .
OPS_PREVIEW ?=
# The Kubernetes versions the chart supports (Chart.yaml's kubeVersion: 1.30 and later), the
# newest patch of each minor the module proxy serves, and the chart's tests that make compat runs
# on each: render, accepted by the API server, the guard's job with the chart's permissions
# (cluster-wide and namespaced), the admission policies, the FlowSchema, helm install and
# upgrade, and helm test's check.
COMPAT_KUBE_VERSIONS ?= v1.30.14 v1.31.14 v1.32.13 v1.33.13 v1.34.4 v1.35.4 v1.36.3 v1.37.2
COMPAT_RUN ?= ^(TestTheAPIServerIsTheVersionRenderedFor|TestEveryProfileLintsAndRenders|TestRenderedManifestsAreAcceptedByTheAPIServer|TestGuardDoesItsJobWithTheChartsPermissions|TestNamespacedInstallIsScopedToItsNamespaces|TestGuardIdentityChangesOnlyItsCABundle|TestClientCAIsHeldByThePolicy|TestFlowSchemaLiftsTheGuardsReadsOfWorkflows|TestUpgradeKeepsTheNewChartsDefaults|TestHelmUpgradeKeepsWhatTheGuardWrote|TestAHelm3ReleaseUpgradesUnderHelm4|TestCheckProvesTheInstall)$$
COMPAT_REPORT ?= docs/evidence/compatibility-kubernetes.md
.PHONY: compat
compat: $(HELM) $(HELM3) $(PROMTOOL) ## The chart's install tests on a real kube-apiserver of each COMPAT_KUBE_VERSIONS (each built from Go modules, ~5 min a version the first time), and on the newest with Helm 3 too; writes COMPAT_REPORT.
	HELM="$(HELM)" HELM3="$(HELM3)" PROMTOOL="$(PROMTOOL)" COMPAT_RUN='$(COMPAT_RUN)' hack/compat.sh $(COMPAT_KUBE_VERSIONS) > $(COMPAT_REPORT).tmp
	mv $(COMPAT_REPORT).tmp $(COMPAT_REPORT)
	@cat $(COMPAT_REPORT)

.PHONY: e2e-ops
e2e-ops: $(HELM) ## The chart's alerts on a real Prometheus and Alertmanager, each brought about by its real cause (docs/alerts.md).
	@assets=$$(hack/envtest-binaries.sh ensure) && ops=$$(hack/ops-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" EXIT_GUARD_OPS_BIN="$$ops" HELM="$(HELM)" EXIT_GUARD_DASHBOARD_PREVIEW="$(if $(OPS_PREVIEW),$(abspath $(OPS_PREVIEW)))" \
	  $(GO) test -tags e2e -count=1 -v -timeout 60m -run '$(OPS_RUN)' ./test/ops

.PHONY: e2e-scheduling
e2e-scheduling: $(HELM) ## Where the chart's replicas land: the real kube-scheduler and kube-controller-manager place its Deployment on Node objects (builds both into the user cache, about 20 minutes the first time).
	@assets=$$(hack/envtest-binaries.sh ensure-scheduler) && \
	  KUBEBUILDER_ASSETS="$$assets" HELM="$(HELM)" $(GO) test -tags e2e -count=1 -v -timeout 20m ./test/scheduling

.PHONY: node-binaries
node-binaries: ## Build the real node's binaries from Go modules into the user cache: kubelet, kube-scheduler, kube-controller-manager, kubectl (KUBE_VERSION), containerd, runc and the CNI loopback plugin (needs libseccomp-dev).
	@hack/envtest-binaries.sh ensure-node >/dev/null && hack/node-binaries.sh ensure >/dev/null

NODE_IMAGES ?= bin/node-images

.PHONY: e2e-node
e2e-node: $(HELM) node-binaries ## The chart, the guard's image and Argo on a real node (kubelet, containerd, runc), contained: its own network and mount namespaces, its kernel tunables its own files (as root).
	GO="$(GO)" hack/node-images.sh $(NODE_IMAGES)
	$(GO) test -c -tags node -o bin/e2e-node.test ./test/node
	cd test/node && HELM="$(abspath $(HELM))" EXIT_GUARD_NODE_IMAGES="$(abspath $(NODE_IMAGES))" \
	  ../../hack/node/netns.sh ../../bin/e2e-node.test -test.v -test.count=1 -test.timeout 30m

.PHONY: certmanager-binaries
certmanager-binaries: ## Build cert-manager's controller and cainjector from Go modules into the user cache (first run about 5 minutes).
	@hack/certmanager-binaries.sh ensure

.PHONY: e2e-certmanager
e2e-certmanager: $(HELM) ## Certificate renewals by the real cert-manager under admission load, with the chart's CA and with a self-signed serving certificate.
	@assets=$$(hack/envtest-binaries.sh ensure) && cm=$$(hack/certmanager-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" EXIT_GUARD_CERT_MANAGER_BIN="$$cm" HELM="$(HELM)" \
	  $(GO) test -tags envtest,certmanager -count=1 -v -timeout 20m -run '^TestCertManager' ./test/chart

.PHONY: argocd-binaries
argocd-binaries: ## Build Argo CD's application controller and repo server from Go modules into the user cache (first run about 10 minutes).
	@hack/argocd-binaries.sh ensure

.PHONY: e2e-argocd
e2e-argocd: $(HELM) ## The Argo CD recipe (docs/gitops.md) on a real Argo CD: the chart pulled from an OCI registry on loopback and synced around a running guard.
	@assets=$$(hack/envtest-binaries.sh ensure) && acd=$$(hack/argocd-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" EXIT_GUARD_ARGOCD_BIN="$$acd" HELM="$(HELM)" $(GO) test -tags 'envtest e2e' -count=1 -v -timeout 30m -run '^TestArgoCD' ./test/chart

##@ Generate and check

.PHONY: manifests
manifests: $(CONTROLLER_GEN) $(HELM_DOCS) $(HELM) ## Generate config/ from the code's markers, copy it into the chart, write the chart README (helm-docs), docs/flags.md (from the binary's flags) and examples/sidecar-values.yaml (from the chart).
	$(CONTROLLER_GEN) rbac:roleName=exit-guard paths=./completionstore/... paths=./internal/metricsauth/... paths=./webhook/... output:rbac:dir=config/rbac \
	  webhook paths=./webhook/... output:webhook:dir=config/webhook
	$(CONTROLLER_GEN) rbac:roleName=exit-guard-certs paths=./internal/certs/... output:rbac:dir=config/rbac-certs
	cp config/rbac/role.yaml $(CHART)/files/rbac/guard.yaml
	cp config/rbac-certs/role.yaml $(CHART)/files/rbac/certs.yaml
	cp config/webhook/manifests.yaml $(CHART)/files/webhook/manifests.yaml
	$(HELM_DOCS) --chart-search-root $(CHART) --template-files README.md.gotmpl --sort-values-order file --log-level warning
	$(GO) test -count=1 -run '^TestFlagReference$$' . -update-docs
	HELM="$(HELM)" $(GO) test -count=1 -run '^TestSidecarExampleIsTheChartsRender$$' ./hack/chartcheck -update

.PHONY: helm-lint
helm-lint: $(HELM) ## Lint the chart.
	$(HELM) lint $(CHART) --kube-version $(KUBE_VERSION:v%=%)

# Helm's module path names its major version (helm.sh/helm/v3, helm.sh/helm/v4).
$(TOOLS)/helm-v%:
	@mkdir -p $(TOOLS)
	@echo "building helm v$* into the user cache from Go modules (about 2 minutes the first time)"
	tmp=$$(mktemp -d $(TOOLS)/.helm-XXXXXX) && GOBIN=$$tmp $(GO) install helm.sh/helm/v$(firstword $(subst ., ,$*))/cmd/helm@v$* && \
	  mv $$tmp/helm $@ && rmdir $$tmp

$(HELM_DOCS):
	@mkdir -p $(TOOLS)
	tmp=$$(mktemp -d $(TOOLS)/.helm-docs-XXXXXX) && GOBIN=$$tmp $(GO) install github.com/norwoodj/helm-docs/cmd/helm-docs@$(HELM_DOCS_VERSION) && \
	  mv $$tmp/helm-docs $@ && rmdir $$tmp

$(PROMTOOL):
	@mkdir -p $(TOOLS)
	@echo "building promtool $(PROMTOOL_VERSION) into the user cache from Go modules (a few minutes the first time)"
	@# Built as hack/ops-binaries.sh builds Prometheus (the same flags and the tag remove_all_sd,
	@# which leaves out the service-discovery plugins and their cloud SDKs: promtool's rule
	@# checks and tests need none), so that the two share their compiled packages.
	tmp=$$(mktemp -d $(TOOLS)/.promtool-XXXXXX) && CGO_ENABLED=0 GOBIN=$$tmp $(GO) install -trimpath -tags remove_all_sd github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION) && \
	  mv $$tmp/promtool $@ && rmdir $$tmp

$(CONTROLLER_GEN):
	@mkdir -p $(TOOLS)
	tmp=$$(mktemp -d $(TOOLS)/.cg-XXXXXX) && GOBIN=$$tmp $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_GEN_VERSION) && \
	  mv $$tmp/controller-gen $@ && rmdir $$tmp

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (pinned version; its govet runs go vet's own analyzers, with the envtest and e2e tags).
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	@mkdir -p $(TOOLS)
	@echo "installing golangci-lint $(GOLANGCI_LINT_VERSION) into the user cache (a few minutes the first time)"
	tmp=$$(mktemp -d $(TOOLS)/.golangci-XXXXXX) && GOBIN=$$tmp $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) && \
	  mv $$tmp/golangci-lint $@ && rmdir $$tmp

.PHONY: fmt
fmt: ## Format the Go sources.
	gofmt -w $$(git ls-files '*.go')

# Files make manifests writes beside config/ and the chart.
GENERATED := docs/flags.md examples/sidecar-values.yaml

.PHONY: verify
verify: manifests helm-lint actionlint ## Regenerate config/, the chart's copies and README; check formatting, go.mod, and the values against their schema and docs; fail on any drift.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: run 'make fmt'"; exit 1; }
	$(GO) mod tidy
	@git diff --exit-code -- go.mod go.sum config $(CHART) $(GENERATED) || { echo "generated files drift: run 'make manifests' and 'go mod tidy', and commit"; exit 1; }
	@test -z "$$(git status --porcelain -- config $(CHART) $(GENERATED))" || { git status --porcelain -- config $(CHART) $(GENERATED); echo "untracked generated files: commit them"; exit 1; }
	HELM="$(HELM)" $(GO) test -count=1 ./hack/chartcheck
	@# No build output or binary in the repository: every tracked file under 1 MiB.
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 {print $$2 " (" $$1 " bytes)"}'); \
	  test -z "$$big" || { echo "tracked files over 1 MiB (a build output or a binary?): $$big"; exit 1; }

##@ Clean

.PHONY: clean
clean: ## Remove ./bin (the API-server binaries and the tools stay in the user cache).
	rm -rf $(BIN)
