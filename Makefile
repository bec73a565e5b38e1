# agentfleet: `make run` runs one query end to end; `make test` runs every test.
SHELL := /usr/bin/env bash
GO ?= go
BIN := bin
GOTEST_FLAGS ?= -race -timeout 20m

.DEFAULT_GOAL := help

help: ## list the targets
	@grep -hE '^[a-zA-Z/_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-16s %s\n", $$1, $$2}'

build: ## build the worker, dispatcher, stand-in agent and dev NATS server into bin/
	$(GO) build -o $(BIN)/worker ./cmd/worker
	$(GO) build -o $(BIN)/dispatcher ./cmd/dispatcher
	$(GO) build -o $(BIN)/fleet-standin-agent ./cmd/fleet-standin-agent
	$(GO) build -o $(BIN)/nats-server github.com/nats-io/nats-server/v2

test: test/bridge test/go ## run every test (the bridge Worker's vitest suite, then Go with the race detector); CI also runs test/chart

test/go: ## Go tests with the race detector
	$(GO) vet ./...
	$(GO) test $(GOTEST_FLAGS) ./...

test/chart: ## the Helm chart: helm lint, helm template of the defaults and each example, every object decoded strictly (deploy/helm/charttest, a module of its own)
	cd deploy/helm/charttest && $(GO) test -count=1 -timeout 30m ./...

test/short: ## Go tests without the slow ones
	$(GO) test -short -timeout 10m ./...

test/bridge: ## the Cloudflare bridge Worker: npm ci (when needed), typecheck and vitest
	./deploy/cloudflare/ci.sh

STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
GOLANGCI_LINT ?= github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

lint: ## gofmt, go vet, staticcheck and golangci-lint (.golangci.yml; pinned, fetched through the module proxy), then the shape check
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(GOLANGCI_LINT) run ./...
	$(GO) run ./internal/shapecheck .

soak: ## chaos run: 1,000 jobs, worker SIGKILLs, a NATS restart past the ack wait, a full journal disk; prints the counts
	set -o pipefail; SOAK_JOBS=$${SOAK_JOBS:-1000} $(GO) test -count=1 -v -run '^TestSoak$$' -timeout 60m ./internal/soak/ | grep -E '^(soak:|---|ok|FAIL|\s+soak_test)'

soak/short: ## the soak with 40 jobs (`make test` runs 24)
	set -o pipefail; SOAK_JOBS=40 $(GO) test -count=1 -v -run '^TestSoak$$' -timeout 15m ./internal/soak/ | grep -E '^(soak:|---|ok|FAIL|\s+soak_test)'

bench: ## fleet benchmarks: one figure per line (name value unit), each beside its baseline (the asynq baseline needs redis-server)
	@log=$$(mktemp); \
	if $(GO) test -run '^$$' -bench 'BenchmarkFleet|BenchmarkGatewayLatency' -benchtime 1x -timeout 30m ./internal/bench/ > $$log 2>&1; then \
		grep -E '^([a-z_0-9]+ [0-9.]+ [a-zA-Z/]+|# .*)$$' $$log; echo "(full output: $$log)"; \
	else cat $$log; exit 1; fi
	@log=$$(mktemp); \
	if $(GO) test -run '^$$' -bench '^BenchmarkContainedFirstLine$$' -benchtime 200x -timeout 10m ./pkg/sandbox/ > $$log 2>&1; then \
		grep -E '^(contained|none)_[a-z_0-9]+ [0-9.]+$$' $$log | sed 's/$$/ ms/'; echo "# contained spawn to first line beside none, same run (target, docs/contained.md: contained_extra_p50_ms at most 15); full output: $$log"; \
	else cat $$log; exit 1; fi

bench/scale: ## the dispatch benchmark at 1/8/32 slots and 100/2,000/20,000 lines per job (BENCH_SLOTS, BENCH_LINES, BENCH_JOBS)
	@for shape in "1 0" "8 0" "32 0" "8 100" "8 2000" "8 20000"; do \
		set -- $$shape; log=$$(mktemp); \
		if BENCH_SLOTS=$$1 BENCH_LINES=$$2 $(GO) test -run '^$$' -bench 'BenchmarkFleet/dispatch' -benchtime 1x -timeout 30m ./internal/bench/ > $$log 2>&1; then \
			grep -E '^(# dispatch|dispatch_|fleet_|baseline_spawn|host_|floor_)' $$log; \
		else cat $$log; exit 1; fi; \
	done

bench/fleet: ## jobs/s and CPU per job with 1, 4 and 16 worker processes (16 slots in all) on one nats-server and on a 3-node cluster, BENCH_FLEET_JOBS (10,000) jobs each
	@log=$$(mktemp); \
	if $(GO) test -run '^$$' -bench '^BenchmarkWorkerShapes$$' -benchtime 1x -timeout 180m ./internal/bench/ > $$log 2>&1; then \
		grep -E '^([a-z_0-9]+ [0-9.]+ [a-zA-Z/]+|# .*)$$' $$log; echo "(full output: $$log)"; \
	else cat $$log; exit 1; fi

bench/failover: ## the stall after each kind of leader kill on a 3-node cluster, p50/max over FLEET_FAILOVER_KILLS (10) kills each
	@$(GO) test -run '^$$' -bench BenchmarkClusterFailover -benchtime 1x -timeout 60m ./internal/e2e/ | grep -E '^failover_'

bench/micro: ## Go micro-benchmarks of the parser, line reader and journal (allocations included), a contained run with and without reused cgroups, and the server's share of the guarantees per line
	$(GO) test -run '^$$' -bench . -benchmem ./pkg/protocol/ ./pkg/journal/
	$(GO) test -run '^$$' -bench BenchmarkCgroupRun -benchtime 2000x ./pkg/sandbox/
	@$(GO) test -run '^$$' -bench BenchmarkServerShare -benchtime 1x ./internal/bench/ | grep -E '^server_share_'

cluster: build ## the fleet on a 3-node JetStream cluster on this machine (deploy/nats/cluster), until Ctrl-C
	./scripts/cluster.sh

run: build ## run one query end to end: embedded NATS, dispatcher, worker, local storage and sandbox
	./scripts/run.sh

tidy: ## go mod tidy
	$(GO) mod tidy

verify: ## go.mod tidy and golden files current
	$(GO) mod tidy -diff

# Images (Dockerfile): binaries built here, copied into the images.
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
IMAGE_REPO ?= agentfleet
IMAGE_TAG ?= dev
BASE_IMAGE ?= docker.io/library/debian:bookworm-slim
LOCAL_BASE_IMAGE ?= localhost/agentfleet/base:bookworm
DEBIAN_MIRROR ?= http://deb.debian.org/debian
CLAUDE_CODE_VERSION ?= 2.1.330
IMAGE_CTX := $(BIN)/image
COMPOSE ?= $(shell if [ "$(CONTAINER_ENGINE)" = podman ] && command -v podman-compose >/dev/null 2>&1; then echo podman-compose; else echo docker compose -f docker-compose.yml -f deploy/compose/docker.yml; fi)

images/bin: ## static linux binaries and the pinned Claude Code executable into bin/image/ (the images' build context)
	@mkdir -p $(IMAGE_CTX)
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags='-s -w' -o $(IMAGE_CTX)/worker ./cmd/worker
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags='-s -w' -o $(IMAGE_CTX)/dispatcher ./cmd/dispatcher
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags='-s -w' -o $(IMAGE_CTX)/fleet-standin-agent ./cmd/fleet-standin-agent
	CGO_ENABLED=0 GOOS=linux $(GO) build -trimpath -ldflags='-s -w' -o $(IMAGE_CTX)/nats-server github.com/nats-io/nats-server/v2
	./scripts/image-claude.sh $(IMAGE_CTX)/claude $(CLAUDE_CODE_VERSION)

images: images/bin ## build agentfleet/worker, dispatcher and nats (IMAGE_TAG, BASE_IMAGE, CONTAINER_ENGINE)
	@for t in worker dispatcher nats; do \
		echo "$(CONTAINER_ENGINE) build $$t"; \
		$(CONTAINER_ENGINE) build -q --build-arg BASE_IMAGE=$(BASE_IMAGE) --target $$t \
			-t $(IMAGE_REPO)/$$t:$(IMAGE_TAG) -f Dockerfile $(IMAGE_CTX) || exit 1; \
	done

images/base: ## a local Debian bookworm base (mmdebstrap + podman import) as LOCAL_BASE_IMAGE, for machines that cannot pull
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mmdebstrap --quiet --variant=minbase --include=bubblewrap,ca-certificates,git,tini \
		bookworm "$$tmp/base.tar" $(DEBIAN_MIRROR) && \
	$(CONTAINER_ENGINE) import -q "$$tmp/base.tar" $(LOCAL_BASE_IMAGE)

test/containers: ## the fleet in containers: images on a local base, nats/dispatcher/two workers under podman, probes, kills (needs root)
	./scripts/test-containers.sh

compose/auth: ## once, before compose/up: NATS JWT auth in deploy/compose/auth (dispatcher auth init), ownership for the containers
	./scripts/compose-auth.sh init

compose/tenant: ## a tenant's creds and token into deploy/compose/tenants/TENANT.{creds,token} (TENANT=acme)
	./scripts/compose-auth.sh tenant $(TENANT)

compose/up: ## the fleet with compose: NATS (JWT), dispatcher --http, WORKERS workers (default 2)
	$(COMPOSE) up -d --scale worker=$${WORKERS:-2}

up: compose/up

down: ## compose down (volumes are kept)
	$(COMPOSE) down

.PHONY: test/chart images images/bin images/base test/containers compose/auth compose/tenant compose/up bench/failover bench/fleet cluster help build test test/go test/short test/bridge lint bench bench/scale bench/micro run tidy verify up down
