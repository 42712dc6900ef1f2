# pdplane — the two commands a newcomer needs are `go run ./cmd/pdplane dev`
# and `make test`.

GO ?= go

.PHONY: all build test vet generate check-generate bench clean

all: build

build:
	$(GO) build -o bin/pdplane ./cmd/pdplane

## test: all set-up and all tests (throwaway PostgreSQL, NIXL venv, vet, race tests, browser test)
test:
	scripts/test.sh

vet:
	$(GO) vet ./...

generate:
	$(GO) generate ./...

## check-generate: fail if generated code is out of date with openapi.yaml
check-generate: generate
	@git diff --exit-code -- server/api || (echo "server/api is out of date: run 'make generate' and commit" >&2; exit 1)

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

clean:
	rm -rf bin .tmp
