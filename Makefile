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

test: test/bridge test/go ## run every test (the bridge Worker's vitest suite, then Go with the race detector)

test/go: ## Go tests with the race detector
	$(GO) vet ./...
	$(GO) test $(GOTEST_FLAGS) ./...

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

up: ## docker compose up (needs a Docker engine)
	docker compose up -d --build

down: ## docker compose down
	docker compose down

.PHONY: bench/failover bench/fleet cluster help build test test/go test/short test/bridge lint bench bench/scale bench/micro run tidy verify up down
