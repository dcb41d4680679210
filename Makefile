# rdma-netns. `make demo` shows it working, `make test` tests it.
GO      ?= go
OUT     ?= _output
PAYLOAD := $(OUT)/vm
VM_RUN  := scripts/vm-run.sh
# Unit tests need root (network namespaces); e2e boots a VM with qemu.
E2E_FLAGS ?= -test.v

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$(VERSION)

export CGO_ENABLED = 0

.PHONY: all build test unit lint e2e e2e-exclusive e2e-shared demo payload vm-prepare clean

all: build

build: $(OUT)/rdma-netns

$(OUT)/rdma-netns: FORCE
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $@ .

FORCE:

## test: unit tests, then the real-kernel end-to-end suite in the test VM.
test: unit e2e

lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed: $$fmt"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e

## unit: go vet, gofmt, and the unit tests of the plugin and of conf/.
unit: lint
	$(GO) test -count=1 ./...
	@if [ -f conf/go.mod ]; then cd conf && $(GO) test -count=1 ./...; fi

payload:
	rm -rf $(PAYLOAD)
	scripts/build-payload.sh $(PAYLOAD) $(wildcard scripts/guest/*.sh) conf/rdma-net.conflist

vm-prepare:
	scripts/vm-prepare.sh

## e2e: one VM boot in exclusive mode for the suite, one in shared mode.
e2e: payload
	$(VM_RUN) --payload $(PAYLOAD) -- e2e.test $(E2E_FLAGS)
	$(VM_RUN) --netns-mode shared --nics 4 --payload $(PAYLOAD) -- e2e.test $(E2E_FLAGS) -test.run TestSharedMode

## demo: the seed story in the test VM: a pod gets its NIC and RDMA device.
demo: payload
	@$(VM_RUN) --nics 3 --payload $(PAYLOAD) -- /payload/demo.sh

clean:
	rm -rf $(OUT)
