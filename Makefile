# gantry — `make help` lists the targets.
GO      ?= go
BIN     ?= bin/gantry
DATA    ?= $(CURDIR)/.gantry-data
CONFIG  ?= examples/gantry.yaml
PKGS    ?= ./...
# make run NATS_LISTEN=127.0.0.1:4223 when another server holds 4222.
NATS_LISTEN ?= 127.0.0.1:4222
HTTP_LISTEN ?= 127.0.0.1:8420
# 'gantry version' reports these; a build without them reads the binary's
# build information.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

NODE_EXAMPLES ?= examples/handlers/node

.PHONY: help build run test bench fuzz lint cross tidy-check fmt-check vet staticcheck tools node-examples screenshots

help: ## list the targets
	@awk 'BEGIN{FS=":.*## "} /^[a-z-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build bin/gantry
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/gantry

run: build ## start the whole system in one process with the example config (NATS_LISTEN=, HTTP_LISTEN= to move it)
	./$(BIN) run --config $(CONFIG) --data $(DATA) --nats-listen $(NATS_LISTEN) --http-listen $(HTTP_LISTEN)

test: fmt-check vet tidy-check node-examples bin/nats ## gofmt check, go vet, go mod tidy check, the Node example's modules, the nats CLI, go test -race
	$(GO) test -race -count=1 -timeout 9m $(PKGS)

screenshots: ## retake the dashboard's screenshots in docs/screenshots (headless chromium)
	$(GO) test -count=1 -run 'TestDashboardInBrowser$$' ./cmd/gantry -update-screenshots

tools: bin/nats bin/staticcheck ## install the nats CLI (the docs test runs the docs' nats lines with it) and staticcheck into bin/

bin/nats:
	GOBIN=$(CURDIR)/bin $(GO) install github.com/nats-io/natscli/nats@v0.5.0

bin/staticcheck:
	GOBIN=$(CURDIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@v0.8.2

# The short form of each 'gantry bench' scenario, against a 'gantry run' it
# starts; docs/BENCHMARKS.md gives the full-size commands.
BENCH_SHORT := "throughput --tasks 10000" "latency --rate 1000 --duration 3s" "lease --duration 3s" \
	"audit --rate 1000 --duration 3s" "backlog --tasks 20000" "soak --rate 200 --duration 20s"

bench: build ## run the go benchmarks, then the short form of each 'gantry bench' scenario (numbers go in docs/BENCHMARKS.md)
	$(GO) test -run '^$$' -bench . -benchmem -timeout 30m $(PKGS)
	@for s in $(BENCH_SHORT); do echo "== gantry bench $$s"; ./$(BIN) bench $$s || exit 1; done

# Every Fuzz target of the module, found in its test files, runs for
# FUZZTIME (go test -fuzz takes one target at a time).
FUZZTIME ?= 10s

fuzz: ## run every fuzz target for FUZZTIME each (FUZZTIME=60s for longer)
	@set -e; for file in $$(git ls-files --cached --others --exclude-standard '*_test.go' | xargs grep -l '^func Fuzz'); do \
		for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
			echo "== $$target ($$(dirname $$file))"; \
			$(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) ./$$(dirname $$file); \
		done; \
	done

lint: fmt-check vet staticcheck ## gofmt check, go vet and staticcheck

staticcheck: bin/staticcheck ## staticcheck on every package
	./bin/staticcheck $(PKGS)

node-examples: ## install the Node handler example's modules (npm ci) for its tests; in CI a missing npm fails
	@if command -v npm >/dev/null 2>&1; then \
		npm ci --prefix $(NODE_EXAMPLES) --no-audit --no-fund --loglevel=error; \
	elif [ -n "$$CI" ]; then \
		echo "npm is missing: the Node handler example cannot be tested (install node and npm)"; exit 1; \
	else \
		echo "npm is missing: the Node handler example tests will be SKIPPED (install node and npm)"; \
	fi

fmt-check: ## fail if any file is not gofmt'ed
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
	if [ -n "$$out" ]; then echo "not gofmt'ed:"; echo "$$out"; exit 1; fi

vet: ## go vet
	$(GO) vet $(PKGS)

tidy-check: ## fail if go.mod or go.sum are not tidy
	@cp go.mod go.mod.tidy-check && cp go.sum go.sum.tidy-check; \
	$(GO) mod tidy; \
	status=0; \
	if ! cmp -s go.mod go.mod.tidy-check || ! cmp -s go.sum go.sum.tidy-check; then \
		echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit"; status=1; fi; \
	mv go.mod.tidy-check go.mod; mv go.sum.tidy-check go.sum; exit $$status

cross: ## build for linux/amd64, darwin/arm64 and windows/amd64, and vet the tests of the other two
	GOOS=linux   GOARCH=amd64 $(GO) build -ldflags "$(LDFLAGS)" -o bin/gantry-linux-amd64 ./cmd/gantry
	GOOS=darwin  GOARCH=arm64 $(GO) build -ldflags "$(LDFLAGS)" -o bin/gantry-darwin-arm64 ./cmd/gantry
	GOOS=windows GOARCH=amd64 $(GO) build -ldflags "$(LDFLAGS)" -o bin/gantry-windows-amd64.exe ./cmd/gantry
	GOOS=darwin  GOARCH=arm64 $(GO) vet ./...
	GOOS=windows GOARCH=amd64 $(GO) vet ./...
