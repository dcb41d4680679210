# rdma-netns. `make demo` shows it working, `make test` tests it.
GO      ?= go
OUT     ?= _output
PAYLOAD := $(OUT)/vm
VM_RUN  := scripts/vm-run.sh
# Unit tests need root (network namespaces); e2e boots a VM with qemu.
E2E_FLAGS ?= -test.v

# Every component's version (Kubernetes, containerd, Multus, ...) comes
# from versions.env, exported to the scripts; `make e2e-k8s
# KUBERNETES_VERSION=... CONTAINERD_VERSION=...` names others.
include versions.env
export $(shell sed -n 's/^\([A-Z][A-Z0-9_]*\)=.*/\1/p' versions.env)

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$(VERSION)

export CGO_ENABLED = 0

.PHONY: all build test unit lint manifests e2e e2e-exclusive e2e-shared e2e-link mpi-link demo payload vm-prepare clean

all: build

build: $(OUT)/rdma-netns $(OUT)/rdma-netns-exporter $(OUT)/rdma-netns-nri $(OUT)/rdma-netns-dra

$(OUT)/rdma-netns: FORCE
	$(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $@ .

# The exporter is a binary of its own: client_golang stays out of the CNI
# binary, which every pod start executes.
$(OUT)/rdma-netns-exporter: FORCE
	$(GO) build -trimpath -o $@ ./cmd/rdma-netns-exporter

# The NRI plugin too: the NRI stub, ttrpc and protobuf stay out of the CNI
# binary (main_test.go checks what it links).
$(OUT)/rdma-netns-nri: FORCE
	$(GO) build -trimpath -o $@ ./cmd/rdma-netns-nri

# The DRA driver is a module of its own: client-go and gRPC stay out of
# the plugin's module, not only out of its binary.
$(OUT)/rdma-netns-dra: FORCE
	cd cmd/rdma-netns-dra && $(GO) build -trimpath -o $(abspath $@) .

FORCE:

## test: unit tests, then the real-kernel end-to-end suite in the test VM
## and the Kubernetes clusters': one node (e2e-k8s), two nodes on one link
## (e2e-k8s-nodes), the oldest pair (e2e-k8s-oldest). make e2e-link, RDMA
## between two bare VMs, is in make bench (bench-link); e2e-k8s-nodes runs
## RDMA across the same link through pods.
test: k8s-prebuild payload unit image-test e2e stress-short e2e-k8s e2e-k8s-nodes e2e-k8s-oldest
# make test builds the first pair's cluster from its start, beside the
# payload, the unit tests and make e2e's VMs, and the oldest pair's beside
# e2e-k8s's first boot (see k8s-prebuild and K8S_PREBUILD_OLDEST below);
# its stage runs last.
test: K8S_PREBUILD_OLDEST = 1

lint:
	@fmt=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$fmt" ]; then echo "gofmt needed: $$fmt"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./e2e
	cd build/image && $(GO) vet ./...
	cd conf && $(GO) vet ./...
	cd cmd/rdma-netns-dra && $(GO) vet ./...
	cd e2e/multus && $(GO) vet -tags e2e ./...
	cd e2e/cri && $(GO) vet -tags e2e ./...
	cd e2e/k8s && $(GO) vet -tags e2e ./...

## manifests: conf/daemonset.yaml and conf/exporter-servicemonitor.yaml
## rendered from the Helm chart conf/helm/rdma-netns (conf's tests fail
## when they differ from it).
manifests:
	cd conf && $(GO) run ./cmd/manifests

## unit: go vet, gofmt, and the unit tests of the plugin, of conf/ and of
## the DRA driver (cmd/rdma-netns-dra).
## The tests run with -vet=off: lint has just run every vet check on the
## same packages, and go test's own subset would analyse every dependency
## again under other flags (a second pass over the Helm and Kubernetes
## modules on empty caches).
## pkg/exporter lints the exposition with promtool from Debian's
## prometheus package (scripts/promtool.sh unpacks it: PROMTOOL); the
## test skips without it, and fails under CI=true (.ci/run).
unit: lint
	PROMTOOL="$${PROMTOOL:-$$(scripts/promtool.sh)}" $(GO) test -count=1 -vet=off ./...
	@if [ -f conf/go.mod ]; then cd conf && $(GO) test -count=1 -vet=off ./...; fi
	cd cmd/rdma-netns-dra && $(GO) test -count=1 -vet=off ./...
	cd e2e/k8s && $(GO) test -count=1 -vet=off ./cluster/... ./deviceplugin/... ./node/... ./railcount/... ./gpudriver/... ./benchcluster/...

payload:
	rm -rf $(PAYLOAD)
	scripts/build-payload.sh $(PAYLOAD) $(wildcard scripts/guest/*.sh) conf/rdma-net.conflist

vm-prepare:
	scripts/vm-prepare.sh

## e2e: one VM boot in exclusive mode for the suite, the Multus tests
## (e2e/multus), the CRI tests (e2e/cri: containerd) and the NRI plugin's
## (e2e/cri/nri), one in shared mode (the suite's, containerd's and the
## NRI plugin's shared-mode tests), and the test VM's watchdog: a guest
## whose watchdog process is killed must end with vm-run.sh's status 126
## within the watchdog's time (on a disk, so that it is not booted again).
e2e: payload
	$(VM_RUN) --payload $(PAYLOAD) -- 'rc=0; e2e.test $(E2E_FLAGS) || rc=1; multus.test $(E2E_FLAGS) || rc=1; cri.test $(E2E_FLAGS) || rc=1; nri.test $(E2E_FLAGS) || rc=1; exit $$rc'
	$(VM_RUN) --netns-mode shared --nics 4 --payload $(PAYLOAD) -- 'rc=0; e2e.test $(E2E_FLAGS) -test.run TestSharedMode || rc=1; cri.test $(E2E_FLAGS) -test.run TestSharedMode || rc=1; nri.test $(E2E_FLAGS) -test.run TestSharedMode || rc=1; exit $$rc'
	@d=$$(mktemp -d); truncate -s 64M $$d/disk; mkfs.ext4 -q -F $$d/disk; \
	$(VM_RUN) --nics 1 --disk $$d/disk --watchdog 5 --timeout 120 -- 'kill $$(cat /run/watchdog.pid); sleep 100' > $$d/log 2>&1; rc=$$?; \
	if [ $$rc = 126 ] && grep -q 'it hung' $$d/log; then echo "[e2e] the test VM's watchdog: $$(grep 'the guest stopped' $$d/log | sed 's/^.vm-run. //')"; rm -rf $$d; \
	else cat $$d/log; rm -rf $$d; echo "[e2e] FAIL: a guest that stopped petting its watchdog ended with status $$rc, want 126 (vm-run.sh --watchdog)"; exit 1; fi

## e2e-link: two test VMs at once joined by an Ethernet link on the
## loopback (vm-run.sh --node/--link, UDP ports E2E_LINK_PORT and the
## next on 127.0.0.1: two runs on one machine need two), RDMA traffic
## between them host to host, then netns to netns through devices
## rdma-netns moved (scripts/e2e-link.sh, scripts/guest/link-test.sh);
## prints both phases' ib_write_bw and ib_send_lat side by side.
E2E_LINK_PORT ?= 13737
e2e-link: payload
	scripts/e2e-link.sh $(PAYLOAD) $(E2E_LINK_PORT) $(OUT)/e2e-link

## mpi-link: the MPI workload image (scripts/k8s/mpi-image.sh) between two
## test VMs on a link: an allreduce over rxe with UCX, the openib BTL, TCP,
## a worker without its device, each with both nodes' rxe counters and a
## verdict (scripts/mpi-link.sh, docs/mpi.md). UDP ports MPI_LINK_PORT and
## the next on 127.0.0.1.
MPI_LINK_PORT ?= 13837
mpi-link:
	MPI_LINK_PORT=$(MPI_LINK_PORT) scripts/mpi-link.sh $(OUT)/mpi-link

## e2e-k8s: a one-node Kubernetes cluster (scripts/k8s/build.sh builds and
## caches its binaries): etcd, kube-apiserver, kube-controller-manager and
## kube-scheduler on the host's loopback (ports K8S_APISERVER_PORT,
## K8S_ETCD_PORT and the next; K8S_KUBELET_PORT forwarded to kubelet; other
## ports let two runs share a machine), kubelet
## and containerd in the test VM, which reaches nothing but the API server
## (vm-run.sh --k8s-api); the tests (e2e/k8s) drive it through the API.
## The DaemonSet runs the image `make image` builds (K8S_IMAGE, amd64),
## imported into the node's containerd.
K8S_APISERVER_PORT ?= 16443
K8S_ETCD_PORT      ?= 12379
K8S_KUBELET_PORT   ?= 10250
K8S_PAYLOAD := $(OUT)/vm-k8s
K8S_IMAGE   := rdma-netns.test/rdma-netns:e2e
# The chart's upgrade and rollback tests go from the image of this commit
# (scripts/k8s/image-at.sh builds and caches it) to this checkout's.
K8S_UPGRADE_FROM ?= 89f7e3dda6eb58d643697defefdb7179e5799a89
# The payload carries kubectl too when K8S_KUBECTL is set (make demo).
K8S_KUBECTL =
## The node's disk (vm-run.sh --disk): the suite's boot and a reboot of the
## node on it (e2e/k8s/zz_reboot_test.go), one control plane throughout;
## then a node without RDMA devices under a control plane of its own
## (--no-rxe).
K8S_DISK    := $(OUT)/k8s-node.img
# The first boot runs every test but the reboot's: about 2500 s alone on
# the two cores (2026-11-28: TestHelm 516 s, TestTenants 506 s, TestDRA
# 480 s, TestPrometheus 230 s), past vm-run.sh's default of 1200 s; the
# limit only ends a hung boot, each test has deadlines of its own.
K8S_FIRST_BOOT_TIMEOUT ?= 3600
K8S_CONTROL_PLANE = $(OUT)/rdma-netns-k8s-cluster -bin-dir "$$K8S_BIN_DIR" -dir $(OUT)/k8s -guest-dir $(K8S_PAYLOAD)/k8s \
	  -apiserver-port $(K8S_APISERVER_PORT) -etcd-port $(K8S_ETCD_PORT) -kubelet-port $(K8S_KUBELET_PORT)
K8S_CLUSTER = $(K8S_CONTROL_PLANE) --
K8S_VM_ARGS = --memory 4096 --k8s-api $(K8S_APISERVER_PORT) --kubelet-port $(K8S_KUBELET_PORT) --payload $(K8S_PAYLOAD)
K8S_VM      = $(VM_RUN) $(K8S_VM_ARGS)
K8S_ENV     = eval "$$(K8S_KUBECTL=$(K8S_KUBECTL) scripts/k8s/build.sh --print-env)"

# k8s-payload: the node's payload (the suite's, kubelet, the images, the
# rendered overlays, the chart and helm) and the control plane's runner.
# What needs nothing of the cluster's build (the image to upgrade from,
# the MPI image's cache, the runner) is made before K8S_ENV waits for
# that build: cold, make test's first boot waits for the build, and
# these took 25 s after it (2026-11-29), mostly downloads.
k8s-payload: payload
	$(MAKE) image IMAGE=$(K8S_IMAGE) PLATFORMS=linux/amd64 IMAGE_LAYOUT=$(OUT)/k8s-image
	@set -e; \
	K8S_UPGRADE_LAYOUT=$$(scripts/k8s/image-at.sh $(K8S_UPGRADE_FROM) rdma-netns.test/rdma-netns:upgrade-from); \
	scripts/k8s/mpi-image.sh $(OUT)/.mpi-image-cached.tar; rm -f $(OUT)/.mpi-image-cached.tar; \
	$(GO) -C e2e/k8s build -o $(abspath $(OUT))/rdma-netns-k8s-cluster ./cmd/rdma-netns-k8s-cluster; \
	$(K8S_ENV); \
	K8S_HELM="$$K8S_HELM" K8S_RUNC="$$K8S_RUNC" K8S_SERVICEMONITOR_CRD="$$K8S_SERVICEMONITOR_CRD" K8S_PROMETHEUS="$$K8S_PROMETHEUS" K8S_UPGRADE_LAYOUT="$$K8S_UPGRADE_LAYOUT" scripts/k8s/payload.sh $(PAYLOAD) $(K8S_PAYLOAD) "$$K8S_BIN_DIR" $(OUT)/k8s-image; \
	if [ -n "$(K8S_KUBECTL)" ]; then cp "$$K8S_KUBECTL_BIN" $(K8S_PAYLOAD)/bin/kubectl; fi

## K8S_TESTS narrows the first boot's tests (a -test.run pattern without
## "$" or quotes; empty: all), K8S_NORDMA= skips the node without RDMA,
## K8S_PAIRS= the node with two PCIe roots and stand-in GPUs (TestDRAPairs:
## eth1..eth4 under one root, eth5..eth7 under the other, two GPUs each;
## -k8s.pairs-required fails the boot without that layout, never skips).
K8S_TESTS  =
K8S_NORDMA = 1
K8S_PAIRS  = 1
e2e-k8s: k8s-payload
	@$(E2E_K8S_STAGES)
## e2e-k8s-stages: e2e-k8s on the payload already in $(OUT), which nothing
## checks is this checkout's: the oldest pair's stage in make test, after
## its background build (OLDEST_PREBUILD) made that payload from the same
## tree. Building it again in the foreground took 57 s (2026-11-29).
e2e-k8s-stages:
	@$(E2E_K8S_STAGES)
E2E_K8S_STAGES = set -e; $(K8S_ENV); \
	$(if $(K8S_PREBUILD_OLDEST),$(OLDEST_PREBUILD);) \
	$(call LOCKUP_RETRY,$(K8S_DISK_STAGE)); \
	$(if $(K8S_NORDMA),$(call LOCKUP_RETRY,$(K8S_CLUSTER) $(K8S_VM) --nics 3 --no-rxe -- 'k8s.test $(E2E_FLAGS) -test.run ^TestNoRDMA$$');) \
	$(if $(K8S_PAIRS),$(call LOCKUP_RETRY,$(K8S_CLUSTER) $(K8S_VM) --nics 8 --pcie-roots 2 --standin-gpus 2 -- 'k8s.test $(E2E_FLAGS) -k8s.pairs-required -test.run ^TestDRAPairs$$'))

## K8S_DISK_STAGE is the node's stage on its disk: the first boot, then
## the boot after its reboot, on a disk and a control plane made anew.
K8S_DISK_STAGE = { rm -f $(K8S_DISK); truncate -s 4G $(K8S_DISK); mkfs.ext4 -q -F $(K8S_DISK); \
	$(K8S_CLUSTER) sh -c '$(K8S_VM) --timeout $(K8S_FIRST_BOOT_TIMEOUT) --disk $(K8S_DISK) -- "k8s.test $(E2E_FLAGS)$(if $(K8S_TESTS), -test.run '\''$(K8S_TESTS)'\'')" && \
	  $(K8S_VM) --disk $(K8S_DISK) -- "k8s.test -k8s.boot reboot $(E2E_FLAGS) -test.run ^TestReboot$$"'; }

## LOCKUP_RETRY runs a stage (one VM without a disk, the disk stage's two
## boots, or the two-node stage, K8S_PAIR) and once more, on a control
## plane, VMs and disks of its own, when a VM's CPUs locked up or it hung
## (vm-run.sh's status 126: a soft lockup or a fired watchdog under TCG,
## which the guest turns into a panic; a cold make test saw the oldest
## pair's second boot lock up, 2026-11-30). Any other failure fails the
## stage.
LOCKUP_RETRY = { $(1) || { rc=$$?; [ $$rc = 126 ] || exit $$rc; \
	  echo "[e2e-k8s] a VM of the stage locked up or hung (vm-run.sh status 126): running the stage once more"; $(1) || exit $$?; }; }

## e2e-k8s-nodes: the cluster with two nodes, two VMs on one Ethernet
## link (scripts/vm-pair.sh; UDP ports K8S_LINK_PORT and the next on
## 127.0.0.1), each kubelet's port forwarded from its own 127.0.0.N, one
## control plane: node 1 installs rdma-netns and Multus as the first boot
## does and runs the two-node tests (e2e/k8s/twonode_test.go); node 2
## (-k8s.boot join, on a disk of its own) is a node of the cluster until
## node 1 stops it, and boots again on its disk when a test reboots it
## (status 75).
K8S_LINK_PORT ?= 13747
K8S_NODE2_DISK := $(OUT)/k8s-node2.img
K8S_NODES_TESTS = ^TestTwoNodes$$
e2e-k8s-nodes: k8s-payload
	@$(if $(K8S_PREBUILD_OLDEST),$(OLDEST_WAIT); )$(call K8S_PAIR,$(K8S_RAILS_REQUIRED) -test.run $(K8S_NODES_TESTS),$(OUT)/k8s-nodes)

## K8S_PAIR_NICS, K8S_PAIR_OPTS: each node's NICs and vm-pair.sh's
## options for both nodes of the two-node rig. By default the rails'
## layout, both fabrics' at once (TestTwoNodes's job holds four rails,
## e2e/k8s/rails_test.go): eth1 and eth2 of the two nodes on links of
## their own, UDP ports K8S_LINK_PORT+2 to K8S_LINK_PORT+5 (rail-optimized:
## a "switch" per rail), eth3 and eth4 on the one shared segment with eth0,
## and the nodes' and so the pods' arp_ignore/arp_announce left at the
## kernel's 0/0, as a real node's pods get them (scripts/README.md).
## K8S_PAIR_NICS=3 K8S_PAIR_OPTS= is the one-link rig: the job holds one
## rail (eth1) and the rails' checks skip.
K8S_PAIR_NICS ?= 5
K8S_PAIR_OPTS ?= --rails 2 --arp-defaults
## K8S_RAILS_REQUIRED: node 1's k8s.test gets -k8s.rails-required under
## CI (CI=true, .ci/run) and whenever K8S_PAIR_OPTS asks for --rails
## (e2e-k8s-nodes, bench-nodes): a pair that came up without the rails'
## layout in its /etc/vm.conf (VM_RAILS, VM_ARP_DEFAULTS, VM_NICS lost on
## the way) fails before the tests instead of running the job on one rail
## and skipping the rails' checks and benches.
K8S_RAILS_REQUIRED = $(if $(or $(filter true,$(CI)),$(findstring --rails,$(K8S_PAIR_OPTS))),-k8s.rails-required)
## K8S_PAIR_CPUS: each node VM's CPUs (vm-run.sh --cpus). One: two nodes
## of two emulated CPUs each on the machine's two cores slowed each other
## far more than twofold (a guest CPU spinning on one the host had
## descheduled).
K8S_PAIR_CPUS ?= 1

# K8S_PAIR is the two-node rig in a recipe, for e2e-k8s-nodes, bench-nodes
# and demo: $(call K8S_PAIR,FLAGS,DIR[,OPTIONS]) has node 1 run k8s.test
# with FLAGS after its own, and vm-pair.sh (with K8S_PAIR_OPTS, then
# OPTIONS) write both consoles in DIR.
K8S_PAIR = set -e; $(K8S_ENV); \
	a="$(K8S_VM_ARGS) --nics $(K8S_PAIR_NICS) --cpus $(K8S_PAIR_CPUS) --timeout 1800"; \
	$(call LOCKUP_RETRY,$(call K8S_PAIR_RUN,$(1),$(2),$(3)))
# K8S_PAIR_RUN is one run of the pair: node 2's disk made anew, a control
# plane of its own.
K8S_PAIR_RUN = { rm -f $(K8S_NODE2_DISK); truncate -s 4G $(K8S_NODE2_DISK); mkfs.ext4 -q -F $(K8S_NODE2_DISK); \
	$(K8S_CONTROL_PLANE) -nodes 2 -- scripts/vm-pair.sh --again 75 $(K8S_PAIR_OPTS) $(3) $(2) $(K8S_LINK_PORT) \
	  "$$a -- 'k8s.test $(E2E_FLAGS) -k8s.nodes 2 $(1)'" \
	  "$$a --disk $(K8S_NODE2_DISK) -- 'k8s.test $(E2E_FLAGS) -k8s.nodes 2 -k8s.boot join'"; }

## e2e-k8s-oldest: the same rig on the oldest supported pair, versions.env's
## KUBERNETES_OLDEST_VERSION and CONTAINERD_OLDEST_VERSION (etcd, Multus
## and helm as e2e-k8s; its own build in $(OUT)/oldest): a pod's life, the
## chart installed with its defaults and an RDMA pod with its device, the
## NRI plugin's device nodes, memlock and /dev/shm, deleted and the device
## home (TestHelm/InstallDefaults, TestRuntimeClassPod), the versions the
## node runs and the NRI plugin's registration (TestNodeVersions,
## TestNRIPluginInterface, after TestContainerdRestart), and the reboot,
## where the pre-installed NRI plugin serves the pods from the runtime's
## start (TestReboot).
K8S_OLDEST_TESTS = ^(TestHelm|TestInstall|TestContainerdRestart|TestNodeVersions|TestNRIPluginInterface|TestRuntimeClassPod|TestReboot)/^InstallDefaults
OLDEST = OUT=$(OUT)/oldest KUBERNETES_VERSION=$(KUBERNETES_OLDEST_VERSION) CONTAINERD_VERSION=$(CONTAINERD_OLDEST_VERSION)
OLDEST_STAGE = e2e-k8s $(OLDEST) K8S_TESTS='$(K8S_OLDEST_TESTS)' K8S_NORDMA= K8S_PAIRS= K8S_PREBUILD_OLDEST=
# In make test (K8S_PREBUILD_OLDEST), a background build that ended
# "built" made this run's payload: the stage runs on it as it is.
e2e-k8s-oldest:
	@$(OLDEST_WAIT); \
	[ ! -s $(OLDEST_PREBUILD_LOG) ] || tail -n 1 $(OLDEST_PREBUILD_LOG); \
	if [ -n "$(K8S_PREBUILD_OLDEST)" ] && tail -n 1 $(OLDEST_PREBUILD_LOG) 2>/dev/null | grep -q '^\[oldest-prebuild\] built '; then \
	  $(MAKE) $(subst e2e-k8s ,e2e-k8s-stages ,$(OLDEST_STAGE)); else $(MAKE) $(OLDEST_STAGE); fi

## k8s-prebuild (in make test): the first pair's cluster (scripts/k8s/build.sh:
## Kubernetes, etcd, Multus, helm, runc, Prometheus; about twelve minutes of
## both cores on empty caches) builds in the background at the lowest CPU
## priority from make test's start: the payload's and the unit tests'
## module downloads and links, and make e2e's and stress-short's VMs, leave
## part of the cores idle, and on empty caches it is the build the first
## boot waits for (cold, it ends some minutes after make e2e). e2e-k8s's
## build.sh waits for it on build.sh's lock and finds its caches filled (a
## failure there is built again in the foreground, and fails there saying
## why). The scripts' apt-get calls wait for each other (scripts/apt.sh).
K8S_PREBUILD_LOG = $(OUT)/k8s-prebuild.log
k8s-prebuild:
	@mkdir -p $(OUT); ( s=$$(date +%s); if nice -n 19 scripts/k8s/build.sh; then r=built; else r=FAILED; fi; \
	  echo "[k8s-prebuild] $$r in the background in $$(( $$(date +%s) - s ))s at nice 19 (log: $(K8S_PREBUILD_LOG))" ) \
	  </dev/null >$(K8S_PREBUILD_LOG) 2>&1 &
	@echo "[k8s-prebuild] the first pair's cluster builds in the background at nice 19 (log: $(K8S_PREBUILD_LOG))"

## K8S_PREBUILD_OLDEST (set by make test): once e2e-k8s's node boots, the
## oldest pair's payload (its Kubernetes release and containerd: about six
## minutes of both cores on empty caches) builds in the background at the
## lowest CPU priority: the emulated node leaves part of the two cores
## idle, and that is what the build gets. The oldest pair's stage itself
## then runs after the two-node stage, in the foreground: not beside
## e2e-k8s's first boot as it did until 2026-11-27, when two emulated
## Kubernetes nodes on the two cores slowed each other far more than
## twofold (a node Ready 3m57s after its kubelet started against 26 s
## alone, the chart's pod Ready after 3m12s against 28-41 s) and the first
## boot's deadlines failed (CI of 8d0dd98; kubernetes.md). e2e-k8s-nodes
## and e2e-k8s-oldest wait for the build (the lock). When the build
## failed, e2e-k8s-oldest builds in the foreground what it failed at, and
## fails there saying why; when make stops before, the build runs to its
## end and leaves its caches for the next run. It starts after e2e-k8s
## has read scripts/k8s/build.sh's env, since the build holds that
## script's lock. It calls `make`, not $$(MAKE): a reference to MAKE
## would have `make -n` run e2e-k8s's recipe, VM and all.
OLDEST_PREBUILD_LOG  = $(OUT)/oldest-prebuild.log
OLDEST_PREBUILD_LOCK = $(OUT)/oldest-prebuild.lock
# OLDEST_WAIT: until the oldest pair's background build is done.
OLDEST_WAIT = mkdir -p $(OUT); flock $(OLDEST_PREBUILD_LOCK) true
OLDEST_PREBUILD = mkdir -p $(OUT); exec 8>$(OLDEST_PREBUILD_LOCK); flock 8; \
	( s=$$(date +%s); if nice -n 19 make --no-print-directory k8s-payload $(OLDEST) K8S_PREBUILD_OLDEST=; \
	  then r=built; else r=FAILED; fi; echo "[oldest-prebuild] $$r in the background in $$(( $$(date +%s) - s ))s at nice 19 (log: $(OLDEST_PREBUILD_LOG))" ) \
	  </dev/null >$(OLDEST_PREBUILD_LOG) 2>&1 & \
	exec 8>&-; echo "[oldest-prebuild] the oldest pair builds in the background at nice 19 (log: $(OLDEST_PREBUILD_LOG))"

.PHONY: k8s-payload k8s-prebuild e2e-k8s e2e-k8s-stages e2e-k8s-nodes e2e-k8s-oldest

## demo: the story as a user meets it, on e2e-k8s-nodes's two-node cluster
## (same build, caches and ports): once both nodes are up, scripts/guest/demo.sh
## runs on node 1 with kubectl: cnitool briefly, then two NCCL pods on node
## 1, their devices, RDMA traffic between them, and the devices back after
## kubectl delete; then an MPI job with a rank on each node, its allreduce
## over RDMA across the link, both pods' RoCE counters, and each device home
## on its node. Node 1's console is the demo's output. The pair boots as
## the one-link rig (3 NICs, every test NIC on the one segment): the demo's
## two NCCL pods on node 1 talk from eth1 to eth2, which the rails' layout
## puts on links of their own. Two CPUs per VM, as the demo last passed:
## with one (2026-11-28) its kubectl execs polling worker 0's sshd did
## not see it listen within 60 tries.
demo: K8S_PAIR_NICS = 3
demo: K8S_PAIR_OPTS =
demo: K8S_PAIR_CPUS = 2
demo:
	@$(MAKE) --no-print-directory k8s-payload K8S_KUBECTL=1
	@$(call K8S_PAIR,-demo /payload/demo.sh,$(OUT)/k8s-nodes,--follow)

## bench: cost of ADD/DEL against the kernel's own cost of the move and
## against upstream rdma-cni (built from the Go module proxy at
## UPSTREAM_RDMA_CNI), the curves against the size of the node (RDMA
## devices on it, pods started at once with a cheap and an emulated slow
## move, the exporter's scrape with devices held by pods), then pod start
## and stop under containerd with and without rdma-netns (e2e/cri,
## CRI_BENCH_FLAGS), in the test VM with 28 NICs; the tables land in
## $(OUT)/bench.txt, a plot per curve (SVG) in BENCH_PLOTS
## (BENCH_PLOTS=docs/plots for the docs). BENCH_BASE=path/to/rdma-netns
## adds that build to the anchor rounds and to the pods-at-once curve, to
## measure a change against its base.
BENCH_PLOTS ?= $(OUT)/plots
BENCH_FLAGS ?=
CRI_BENCH_FLAGS ?=
BENCH_BASE ?=
UPSTREAM_RDMA_CNI ?= v1.6.0
bench: export PAYLOAD_UPSTREAM = $(UPSTREAM_RDMA_CNI)
bench: payload
	@if [ -n "$(BENCH_BASE)" ]; then cp "$(BENCH_BASE)" $(PAYLOAD)/bin/rdma-netns-base; fi
	@echo "host load before: $$(uptime)" > $(OUT)/bench.host
	@{ $(VM_RUN) --nics 28 --payload $(PAYLOAD) -- 'rdma-netns-bench $(BENCH_FLAGS) && rdma-netns-cri bench $(CRI_BENCH_FLAGS)'; echo $$? > $(OUT)/bench.rc; } | tee $(OUT)/bench.log
	@sed -n '/^=== BENCH TABLE BEGIN ===/,/^=== BENCH TABLE END ===/p' $(OUT)/bench.log | sed '1d;$$d' > $(OUT)/bench.txt
	@sed -n '/^=== CRI BENCH BEGIN ===/,/^=== CRI BENCH END ===/p' $(OUT)/bench.log | sed '1d;$$d' | sed '1s/^/\n/' >> $(OUT)/bench.txt
	@sed -n '/^=== CRI ATTACHMENTS BEGIN ===/,/^=== CRI ATTACHMENTS END ===/p' $(OUT)/bench.log | sed '1d;$$d' | sed '1s/^/\n/' >> $(OUT)/bench.txt
	@echo "host load after:  $$(uptime)" >> $(OUT)/bench.host; { echo; cat $(OUT)/bench.host; } >> $(OUT)/bench.txt; cat $(OUT)/bench.host; rm -f $(OUT)/bench.host
	@mkdir -p $(BENCH_PLOTS) && awk -v dir='$(BENCH_PLOTS)' '/^=== PLOT .* BEGIN ===$$/ { f = dir "/" $$3; next } /^=== PLOT END ===$$/ { close(f); print "bench plot: " f; f = ""; next } f != "" { print > f }' $(OUT)/bench.log
	@rc=$$(cat $(OUT)/bench.rc); rm -f $(OUT)/bench.rc; [ "$$rc" != 0 ] || echo "bench table: $(OUT)/bench.txt"; exit $$rc

## bench-nri: what rdma-netns-nri adds to CreateContainer+StartContainer
## under containerd, in alternating blocks with and without it (make bench
## runs it too); the table lands in $(OUT)/bench-nri.txt.
NRI_BENCH_FLAGS ?=
bench: bench-nri
bench-nri: payload
	@{ $(VM_RUN) --payload $(PAYLOAD) -- nri.test -test.run TestBenchCreateContainer -nri.bench $(NRI_BENCH_FLAGS); echo $$? > $(OUT)/bench-nri.rc; } | tee $(OUT)/bench-nri.log
	@sed -n '/^=== NRI BENCH BEGIN ===/,/^=== NRI BENCH END ===/p' $(OUT)/bench-nri.log | sed '1d;$$d' > $(OUT)/bench-nri.txt
	@rc=$$(cat $(OUT)/bench-nri.rc); rm -f $(OUT)/bench-nri.rc; [ "$$rc" != 0 ] || echo "NRI bench table: $(OUT)/bench-nri.txt"; exit $$rc

## bench-link: RDMA between the two kernels of make e2e-link, host to host
## and netns to netns through devices rdma-netns moved, BENCH_LINK_ROUNDS
## alternated rounds of each (make bench runs it too); the table of
## medians and their ratio lands in $(OUT)/bench-link.txt.
BENCH_LINK_ROUNDS ?= 5
bench: bench-link
bench-link: payload
	@ROUNDS=$(BENCH_LINK_ROUNDS) scripts/e2e-link.sh $(PAYLOAD) $(E2E_LINK_PORT) $(OUT)/bench-link > $(OUT)/bench-link.txt
	@cat $(OUT)/bench-link.txt; echo "link bench table: $(OUT)/bench-link.txt"

## bench-k8s: time from pod create to Running under the real kubelet and
## Multus (thick) of make e2e-k8s, for a pod with each count of RDMA
## attachments in K8S_BENCH_ATTACHMENTS (attachment k a NAD on ethk), on
## NADs whose chain has rdma-netns and on ones without it, K8S_BENCH_ROUNDS
## pods of each kind per count, interleaved; per count, the medians, their
## ratio and rdma-netns's median cost per attachment (an emulated node: the
## ratio is the figure). Then, in the same boot, the DaemonSet's exporter
## scraped through its token check (HTTPS, TokenReview and
## SubjectAccessReview) with no pod holding an RDMA device and with 8,
## K8S_SCRAPE_BENCH requests of each kind (make bench runs it too; 0 skips
## either part). Both tables land in $(OUT)/bench-k8s.txt.
K8S_BENCH_ATTACHMENTS ?= 1,2,4,8
# Rounds per count. An estimate, not a measurement: a pod with one
# attachment starts in 8 s on a quiet machine and 12-30 s on a loaded one,
# and is gone with its NIC home 6-12 s after its delete; guessing 1-4 s
# more per further attachment, one round of 1,2,4,8 (8 pods, 30
# attachments) takes 3 to 8 minutes: 3 rounds 9-24 minutes, 5 rounds
# 15-40, on top of the boot and the scrape bench.
K8S_BENCH_ROUNDS ?= 3
K8S_SCRAPE_BENCH ?= 50
## K8S_BENCH_DRA_NICS: the counts of NICs per pod of TestBenchDRA (the
## same boot): a pod holding them by ResourceClaim (rdma-netns-dra) through
## a NAD, one holding them by the claim alone (the claims entry), and one
## holding them by the suite's device plugin, K8S_BENCH_ROUNDS of each per
## count, interleaved; its table follows the first.
K8S_BENCH_DRA_NICS ?= 1,4
## K8S_BENCH_TESTS: which of the three run (a -test.run pattern without
## quotes; on the command line "$$" for an end anchor, as make reads it).
K8S_BENCH_TESTS ?= ^(TestBenchPodStart|TestBenchDRA|TestBenchScrape)$$
# eth0 and a test NIC per attachment of the largest count (eth1..eth8),
# which are also the scrape bench's 8: vm-run.sh's default, named because
# the bench needs it. A larger count needs it + 1 NICs (28 at most).
K8S_BENCH_NICS ?= 9
# The VM's limit (vm-run.sh's default is 1200 s): by the estimate above 3
# rounds and the rest of the boot stay within it; raise it with the rounds.
K8S_BENCH_TIMEOUT ?= 3600
bench: bench-k8s
bench-k8s:
	@$(MAKE) --no-print-directory k8s-payload
	@{ $(K8S_ENV); $(K8S_CLUSTER) $(K8S_VM) --nics $(K8S_BENCH_NICS) --timeout $(K8S_BENCH_TIMEOUT) -- 'k8s.test -test.v -test.run "$(K8S_BENCH_TESTS)" -k8s.bench $(K8S_BENCH_ROUNDS) -k8s.bench-attachments $(K8S_BENCH_ATTACHMENTS) -k8s.bench-dra-nics $(K8S_BENCH_DRA_NICS) -k8s.scrape-bench $(K8S_SCRAPE_BENCH)'; echo $$? > $(OUT)/bench-k8s.rc; } | tee $(OUT)/bench-k8s.log
	@sed -n '/^=== K8S BENCH BEGIN ===/,/^=== K8S BENCH END ===/p' $(OUT)/bench-k8s.log | sed '1d;$$d' > $(OUT)/bench-k8s.txt
	@sed -n '/^=== K8S DRA BENCH BEGIN ===/,/^=== K8S DRA BENCH END ===/p' $(OUT)/bench-k8s.log | sed '1d;$$d' | sed '1s/^/\n/' >> $(OUT)/bench-k8s.txt
	@sed -n '/^=== K8S SCRAPE BENCH BEGIN ===/,/^=== K8S SCRAPE BENCH END ===/p' $(OUT)/bench-k8s.log | sed '1d;$$d' | sed '1s/^/\n/' >> $(OUT)/bench-k8s.txt; cat $(OUT)/bench-k8s.txt
	@rc=$$(cat $(OUT)/bench-k8s.rc); rm -f $(OUT)/bench-k8s.rc; [ "$$rc" != 0 ] || echo "Kubernetes bench table: $(OUT)/bench-k8s.txt"; exit $$rc

## bench-nodes: job start on the two-node cluster of make e2e-k8s-nodes:
## the time from the creation of a two-rank MPI job's pods (one per node)
## to the end of its first allreduce, on a NAD whose chain has rdma-netns
## (the job over RDMA) and on the same chain without it (over TCP),
## K8S_JOB_BENCH_ROUNDS jobs of each, alternated (make bench runs it too;
## e2e/k8s/bench_nodes_test.go); the table of medians lands in
## $(OUT)/bench-nodes.txt, the nodes' consoles in $(OUT)/bench-nodes/.
## Then, in the same boot, ib_write_bw on two rails at once against one
## rail, K8S_RAIL_BENCH_ROUNDS rounds of each, alternated (TestBenchRails,
## e2e/k8s/rails_test.go), its table after the first; then how UCX spreads
## an allreduce (1 MiB x 5) over TestTwoNodes's four rails at its default
## rail counts (UCX_NET_DEVICES alone) against UCX_MAX_EAGER_RAILS and
## UCX_MAX_RNDV_RAILS at 4 (what the job uses), K8S_UCX_RAIL_BENCH_ROUNDS
## allreduces of each, alternated (TestBenchRailsUCX,
## e2e/k8s/rails_ucx_test.go): each kind's time and each rail's share of
## the RoCE packets, its table last.
K8S_JOB_BENCH_ROUNDS ?= 3
K8S_RAIL_BENCH_ROUNDS ?= 3
K8S_UCX_RAIL_BENCH_ROUNDS ?= 3
bench: bench-nodes
# The tests' pattern has no "(a|b)": the guest's sh -c reads the command.
bench-nodes:
	@$(MAKE) --no-print-directory k8s-payload
	@{ ( $(call K8S_PAIR,$(K8S_RAILS_REQUIRED) -test.run ^TestBench[JR][A-Za-z]*$$ -k8s.bench-jobs $(K8S_JOB_BENCH_ROUNDS) -k8s.bench-rails $(K8S_RAIL_BENCH_ROUNDS) -k8s.bench-ucx-rails $(K8S_UCX_RAIL_BENCH_ROUNDS),$(OUT)/bench-nodes) ); echo $$? > $(OUT)/bench-nodes.rc; } 2>&1 | tee $(OUT)/bench-nodes.log
	@sed -n '/^=== K8S JOB BENCH BEGIN ===/,/^=== K8S JOB BENCH END ===/p' $(OUT)/bench-nodes/node1.log | sed '1d;$$d' > $(OUT)/bench-nodes.txt
	@sed -n '/^=== K8S RAILS BENCH BEGIN ===/,/^=== K8S RAILS BENCH END ===/p' $(OUT)/bench-nodes/node1.log | sed '1d;$$d' | sed '1s/^/\n/' >> $(OUT)/bench-nodes.txt
	@sed -n '/^=== K8S UCX RAILS BENCH BEGIN ===/,/^=== K8S UCX RAILS BENCH END ===/p' $(OUT)/bench-nodes/node1.log | sed '1d;$$d' | sed '1s/^/\n/' >> $(OUT)/bench-nodes.txt; cat $(OUT)/bench-nodes.txt
	@rc=$$(cat $(OUT)/bench-nodes.rc); rm -f $(OUT)/bench-nodes.rc; [ "$$rc" != 0 ] || echo "job start bench table: $(OUT)/bench-nodes.txt"; exit $$rc

## bench-cluster: the scheduler and the API server at cluster scale, on
## this machine, not in make bench or make test (issue 66,
## docs/bench-cluster.md): a control plane of its own (etcd,
## kube-apiserver, kube-scheduler, the controller-manager's resourceclaim
## controller alone; scripts/k8s/build.sh's binaries) with
## BENCH_CLUSTER_NODES kubelet-less Ready nodes, each an 8-GPU 8-NIC
## server (4 PCIe roots, 2 NUMA nodes) whose NIC slice rdma-netns-dra's
## own publishing code writes from that server's sysfs and whose GPU slice
## is the stand-in GPU driver's. Per size: the N publishers' first
## publish, BENCH_CLUSTER_STEADY of rest (the issue's figure is 30m) and
## one NIC unplugged and back, from the API server's metrics; then pods of
## conf's templates as shipped (pairs, rails, any-2) and of a GPU-only
## control, empty to full and one more that fits nowhere: pods/s and each
## pod's latency, as ratios to the control, and the scheduler's CPU. The
## tables land in $(OUT)/bench-cluster.txt, the plots in BENCH_PLOTS.
## Ports: BENCH_CLUSTER_APISERVER_PORT, BENCH_CLUSTER_ETCD_PORT and the
## next (not e2e-k8s's, which may run beside it).
BENCH_CLUSTER_NODES ?= 100,500
BENCH_CLUSTER_TEMPLATES ?=
BENCH_CLUSTER_STEADY ?= 1m
BENCH_CLUSTER_RESCAN ?= 30s
BENCH_CLUSTER_IN_FLIGHT ?= 20
BENCH_CLUSTER_APISERVER_PORT ?= 17443
BENCH_CLUSTER_ETCD_PORT ?= 13379
BENCH_CLUSTER_KUBELET_PORT ?= 17250
BENCH_CLUSTER_FLAGS ?=
bench-cluster:
	@mkdir -p $(OUT); $(K8S_ENV); \
	$(GO) -C e2e/k8s build -o $(abspath $(OUT))/rdma-netns-bench-cluster ./cmd/rdma-netns-bench-cluster || exit 1; \
	{ $(OUT)/rdma-netns-bench-cluster -bin-dir "$$K8S_BIN_DIR" -dir $(OUT)/bench-cluster -conf conf \
	    -nodes $(BENCH_CLUSTER_NODES) -templates '$(BENCH_CLUSTER_TEMPLATES)' -steady $(BENCH_CLUSTER_STEADY) \
	    -rescan $(BENCH_CLUSTER_RESCAN) -in-flight $(BENCH_CLUSTER_IN_FLIGHT) -apiserver-port $(BENCH_CLUSTER_APISERVER_PORT) \
	    -etcd-port $(BENCH_CLUSTER_ETCD_PORT) -kubelet-port $(BENCH_CLUSTER_KUBELET_PORT) $(BENCH_CLUSTER_FLAGS); \
	  echo $$? > $(OUT)/bench-cluster.rc; } | tee $(OUT)/bench-cluster.log | sed '/^=== PLOT .* BEGIN ===$$/,/^=== PLOT END ===$$/d'
	@sed -n '/^=== BENCH CLUSTER BEGIN ===/,/^=== BENCH CLUSTER END ===/p' $(OUT)/bench-cluster.log | sed '1d;$$d' > $(OUT)/bench-cluster.txt
	@mkdir -p $(BENCH_PLOTS) && awk -v dir='$(BENCH_PLOTS)' '/^=== PLOT .* BEGIN ===$$/ { f = dir "/" $$3; next } /^=== PLOT END ===$$/ { close(f); print "bench plot: " f; f = ""; next } f != "" { print > f }' $(OUT)/bench-cluster.log
	@rc=$$(cat $(OUT)/bench-cluster.rc); rm -f $(OUT)/bench-cluster.rc; [ "$$rc" != 0 ] || echo "cluster bench table: $(OUT)/bench-cluster.txt"; exit $$rc

## stress: fuzz the parsers on the host, then seeded random ADD/DEL rounds,
## concurrent ADD/DEL on the same and other devices,
## racing ADDs, injected faults and bad input in the test VM, then
## containerd SIGKILLed in the middle of RunPodSandbox CRI_STRESS_ROUNDS
## times (e2e/cri). Reproduce a run with STRESS_FLAGS="-seed N" or
## CRI_STRESS_FLAGS="-seed N".
STRESS_ROUNDS ?= 200
STRESS_FLAGS ?=
CRI_STRESS_ROUNDS ?= 30
CRI_STRESS_FLAGS ?=
STRESS_SHORT_FLAGS ?= -rounds 40 -races 6 -concurrent 3 -kills 12 -reboots 2
stress: fuzz stress-vm

stress-vm: payload
	$(VM_RUN) --nics 10 --payload $(PAYLOAD) -- 'rdma-netns-stress -rounds $(STRESS_ROUNDS) $(STRESS_FLAGS) && rdma-netns-cri stress -rounds $(CRI_STRESS_ROUNDS) $(CRI_STRESS_FLAGS)'

## stress-short: the short stress run `make test` includes (no fuzzing),
## with CRI_STRESS_SHORT_ROUNDS kills of containerd.
CRI_STRESS_SHORT_ROUNDS ?= 3
stress-short: payload
	$(VM_RUN) --nics 10 --payload $(PAYLOAD) -- 'rdma-netns-stress $(STRESS_SHORT_FLAGS) $(STRESS_FLAGS) && rdma-netns-cri stress -rounds $(CRI_STRESS_SHORT_ROUNDS) $(CRI_STRESS_FLAGS)'

## fuzz: every Go fuzz target under pkg/ and plugin/, one at a time, FUZZTIME each.
FUZZTIME ?= 10s
fuzz:
	@set -e; for file in $$(grep -rl --include='*_test.go' '^func Fuzz' pkg plugin); do \
	  for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$file); do \
	    echo "fuzz: $$fn in ./$$(dirname $$file) for $(FUZZTIME)"; \
	    $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$(dirname $$file); \
	  done; \
	done

.PHONY: bench bench-nri bench-link bench-k8s bench-nodes bench-cluster stress stress-vm stress-short fuzz

## image: the DaemonSet's image without Docker: the static binaries of
## IMAGE_BINS (NAME=PACKAGE) on scratch at /NAME, for every platform in
## PLATFORMS, as an OCI image layout in IMAGE_LAYOUT (build/image, a module
## of its own so that go-containerregistry stays out of the plugin).
## A PACKAGE directory with a go.mod of its own (cmd/rdma-netns-dra) is
## built in its module.
## `make image IMAGE=registry.example/rdma-netns:v1 push` pushes it.
IMAGE        ?= rdma-netns:$(VERSION)
PLATFORMS    ?= linux/amd64,linux/arm64
IMAGE_BINS   := rdma-netns=. rdma-netns-exporter=./cmd/rdma-netns-exporter rdma-netns-nri=./cmd/rdma-netns-nri rdma-netns-dra=./cmd/rdma-netns-dra
IMAGE_LAYOUT ?= $(OUT)/image
IMAGE_TOOL   := $(GO) -C build/image run .
comma := ,
space := $(subst ,, )
IMAGE_BIN_LIST = $(subst $(space),$(comma),$(strip $(foreach b,$(IMAGE_BINS),$(firstword $(subst =, ,$(b))))))
image-bins:
	@set -e; for p in $(subst $(comma), ,$(PLATFORMS)); do \
	  for b in $(IMAGE_BINS); do \
	    echo "go build $${b#*=} for $$p"; \
	    dir=.; pkg=$${b#*=}; if [ $$pkg != . ] && [ -f $$pkg/go.mod ]; then dir=$$pkg; pkg=.; fi; \
	    GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) -C $$dir build -trimpath -ldflags "-s -w $(LDFLAGS)" \
	      -o $(abspath $(OUT))/$${p%/*}_$${p#*/}/$${b%%=*} $$pkg; \
	  done; \
	done

image: image-bins
	$(IMAGE_TOOL) build -bin-dir $(abspath $(OUT)) -platforms $(PLATFORMS) \
	  -bins $(IMAGE_BIN_LIST) -tag $(IMAGE) -out $(abspath $(IMAGE_LAYOUT))

## push: push the image make image wrote to IMAGE (a registry reference);
## prints the reference by digest to pin in conf/daemonset.yaml.
push: image
	$(IMAGE_TOOL) push -layout $(abspath $(IMAGE_LAYOUT)) $(IMAGE)

## image-test: build the image of the binaries make image builds, push it
## to an in-process registry, pull it back by digest, check the binaries and
## run the install command.
image-test: image-bins
	cd build/image && IMAGE_TEST_BIN_DIR=$(abspath $(OUT)) IMAGE_TEST_BINS=$(IMAGE_BIN_LIST) $(GO) test -count=1 ./...

.PHONY: image image-bins push image-test

clean:
	rm -rf $(OUT)
