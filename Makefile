# exit-guard: build, test and verify. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

GO ?= go
BIN := $(CURDIR)/bin
# Tools are installed into ./bin at pinned versions.
GOLANGCI_LINT_VERSION ?= v2.15.0
GOLANGCI_LINT := $(BIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
# Options for `go test`, e.g. GOTESTFLAGS='-run TestX -v'.
GOTESTFLAGS ?=

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_.-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the exit-guard binary into ./bin.
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/exit-guard .

.PHONY: demo
demo: build ## Replay the reference scenario: local API server, the guard, a stale exit handler refused.
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" $(GO) run ./test/demo --guard $(BIN)/exit-guard

.PHONY: envtest-binaries
envtest-binaries: ## Build kube-apiserver and etcd from Go modules into the user cache (first run ~10 min).
	@hack/envtest-binaries.sh ensure

.PHONY: test
test: ## Run every test with the race detector against a real kube-apiserver (builds it if missing).
	@assets=$$(hack/envtest-binaries.sh ensure) && \
	  KUBEBUILDER_ASSETS="$$assets" $(GO) test -race -count=1 $(GOTESTFLAGS) ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) ## Run golangci-lint (pinned version) and go vet.
	$(GO) vet ./...
	$(GOLANGCI_LINT) run ./...

$(GOLANGCI_LINT):
	@mkdir -p $(BIN)
	@echo "installing golangci-lint $(GOLANGCI_LINT_VERSION) into ./bin (a few minutes the first time)"
	GOBIN=$(BIN)/.golangci-tmp $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(BIN)/.golangci-tmp/golangci-lint $@ && rmdir $(BIN)/.golangci-tmp

.PHONY: fmt
fmt: ## Format the Go sources.
	gofmt -w $$(git ls-files '*.go')

.PHONY: verify
verify: ## Check formatting, go.mod tidiness and generated files; fails on any drift.
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt: run 'make fmt'"; exit 1; }
	$(GO) mod tidy
	@git diff --exit-code -- go.mod go.sum || { echo "go.mod/go.sum drift: run 'go mod tidy' and commit"; exit 1; }

.PHONY: clean
clean: ## Remove ./bin (the cached API-server binaries stay in the user cache).
	rm -rf $(BIN)
