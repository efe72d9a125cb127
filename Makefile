# isthmus — every target a newcomer or CI needs. `make help` lists them.
SHELL := /bin/bash
CACHE ?= $(HOME)/.cache/isthmus
export CARGO_TARGET_DIR ?= $(CURDIR)/target

.PHONY: help test unit demo

help:
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | sort

# The stages of `make test`, in order. A failing stage does not stop the others: every result is reported.
TEST_STAGES := unit operator-it chart-lint examples-validate images-test arm64-test kernel-test cluster-smoke e2e e2e-vm

test: ## the whole suite: unit and host-kernel tests, API-server tests, chart, stock-kernel rig, real cluster smoke, end-to-end on this kernel and on stock-kernel nodes; every stage runs, a table of results ends it
	@e2e/run-stages $(TEST_STAGES)

unit: ## cargo tests of every crate, then the datapaths' root-only netlink tests (ignored in a plain cargo test) as root, the test scripts' own tests (the workflows against the Makefile and .ci/run among them), and actionlint over the workflows
	cargo test --workspace --locked
	cargo test -p isthmus-datapaths --lib --locked -- --ignored
	@python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml >&2 || \
	  { echo "unit: PyYAML is missing and pip could not install it (apt-get install python3-yaml)" >&2; exit 1; }
	python3 -m unittest discover -s e2e -p 'test_*.py'
	$(MAKE) --no-print-directory lint-workflows

.PHONY: clean-leftovers
clean-leftovers: ## remove what an interrupted run of isthmus's scripts left (clusters, guests, bridges, namespaces, mounts, state dirs), naming each; .ci/run does this first
	e2e/clean-leftovers

# ---- stock-kernel rig (e2e/kernel/README.md): netem & co. on Debian bookworm 6.1 (QEMU TCG) and sid 7.x (UML)
.PHONY: kernel-test kernel-bench kernel-test-one kernel-fetch

kernel-test: ## datapath tests inside stock kernels (Debian packages resolved by rule, cached in $(CACHE)/kernel), both kernels at once (one vCPU each); a measurement is taken up to 3 times, every retry in the report
	CACHE=$(CACHE) e2e/kernel/rig all --parallel

kernel-bench: ## the datapaths' benchmark side by side (tc tree and userspace) in both stock kernels and, userspace only, on this machine's kernel: medians of 3 runs each (docs/benchmarks.md)
	CACHE=$(CACHE) e2e/kernel/rig bench

kernel-test-one: ## one test (or a comma list / substring) in the rig: make kernel-test-one TEST=delay [KERNEL=sid|bookworm|host]
	@test -n "$(TEST)" || { echo "usage: make kernel-test-one TEST=name[,name] [KERNEL=bookworm|sid|host]"; e2e/kernel/rig list; exit 2; }
	CACHE=$(CACHE) e2e/kernel/rig all --test $(TEST) $(if $(KERNEL),--kernel $(KERNEL))

kernel-fetch: ## only resolve, download and prepare the rig's kernels and host tools (REFRESH=1: ask the archive even when cached)
	CACHE=$(CACHE) e2e/kernel/rig fetch $(if $(REFRESH),--refresh)

# ---- e2e cluster (e2e/cluster/README.md). Provider: local here, kind where Docker and kind exist
#      (ISTHMUS_CLUSTER_PROVIDER=local|kind).
.PHONY: cluster-up cluster-down cluster-smoke lint-workflows

cluster-smoke: ## a real 2-node cluster: pods, ping/TCP within and across nodes, Services, exec/logs, GC; down leaves nothing
	@start=$$(date +%s); e2e/cluster/smoke; rc=$$?; echo "cluster-smoke: exit $$rc after $$(( $$(date +%s) - start )) s"; exit $$rc

cluster-up: ## start the e2e cluster (NODES=2; CONTROL_PLANE_ONLY=1 for etcd + apiserver + controller-manager; ISTHMUS_CLUSTER_PROVIDER=vm for stock-kernel nodes)
	e2e/cluster/cluster up --nodes $(or $(NODES),2) $(if $(CONTROL_PLANE_ONLY),--control-plane-only)

cluster-down: ## stop the e2e cluster and remove everything it made
	e2e/cluster/cluster down

lint-workflows: ## actionlint (pinned in e2e/cluster/tools/go.mod) over .github/workflows
	"$$(e2e/cluster/lib/install-tool.sh actionlint)" -no-color

# ---- images (e2e/images/build): static binaries -> OCI archives in $(CARGO_TARGET_DIR)/images, no Docker daemon
.PHONY: images images-test release-images arm64-test

images: ## build static binaries and OCI image archives (IMAGES="operator agent probe", ARCHES=amd64[,arm64]); prints ARCHIVE REF DIGEST BYTES
	$(if $(ARCHES),ISTHMUS_IMAGE_ARCHES=$(ARCHES)) e2e/images/build $(IMAGES)

# Not in `make images` by default: arm64 is a second release build (cross-compiled); the release workflow runs it.
release-images: ## images for linux/amd64 and linux/arm64: per-platform archives and a multi-platform image index per component (isthmus-<image>-multiarch.tar)
	ISTHMUS_IMAGE_ARCHES=amd64,arm64 e2e/images/build $(IMAGES)

# VERSION: default the workspace version; OWNER: the ghcr.io namespace, default the repository's owner in Cargo.toml.
.PHONY: release-dry-run
release-dry-run: ## the release workflow's build steps, no push or signing: images for amd64 and arm64, image indexes, the chart pinned to their digests, in $(CARGO_TARGET_DIR)/dist
	e2e/release/package $(or $(VERSION),$$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' Cargo.toml)) \
		$(or $(OWNER),$$(sed -n 's|^repository *= *"https://github.com/\([^/]*\)/.*|\1|p' Cargo.toml))

# In `make test`: warm it costs the arm64 test build of what changed plus ~16 s of tests (commit b2aa7a9).
arm64-test: ## the datapaths', agent's and operator's unit tests built for arm64 (musl, static) and run under qemu-user; installs the cross toolchain and qemu-user-static
	e2e/images/arm64-test

images-test: ## tests of the image pipeline (archive checks, determinism) on busybox-static; no release build
	python3 e2e/images/test_verify_archive.py

# ---- operator against a real control plane (etcd + kube-apiserver + controller-manager; e2e/cluster/README.md)
.PHONY: operator-it

operator-it: ## operator integration tests (CRD, finalizer, status, leader hand-over and fencing, `uninstall` subcommand, a real agent on 127.0.0.1, the readiness gate, the agent's /metrics by ServiceAccount token) and `kubectl isthmus` on a throwaway control plane
	@export ISTHMUS_CLUSTER_NAME=operator-it-$$$$; \
	trap 'e2e/cluster/cluster down >/dev/null' EXIT; \
	cargo build -p isthmus-agent && \
	e2e/cluster/cluster up --control-plane-only && \
	export KUBECONFIG=$$(e2e/cluster/cluster kubeconfig) ISTHMUS_TEST_KUBECONFIG=$$(e2e/cluster/cluster kubeconfig) \
		ISTHMUS_TEST_AGENT_BIN=$(CARGO_TARGET_DIR)/debug/isthmus-agent && \
	cargo test -p isthmus-operator --test controller -- --ignored && \
	cargo test -p isthmus-operator --test leader -- --ignored && \
	cargo test -p isthmus-operator --test uninstall -- --ignored && \
	cargo test -p isthmus-operator --test apiserver -- --ignored && \
	cargo test -p isthmus-agent --test agent_metrics_token -- --ignored && \
	cargo test -p kubectl-isthmus --test apiserver -- --ignored

# ---- Helm chart and examples (each starts its own control-plane-only cluster, ~10 s, and tears it down)
.PHONY: chart-lint examples-validate

chart-lint: ## helm lint/template of charts/isthmus against a real 1.34 API server; CRD copy, schema, no CA key rendered, the operator as CA and signer with the real agent
	charts/isthmus/tests/lint.sh

examples-validate: ## every examples/*.yaml through kubectl apply --dry-run=server with the NetworkLink CRD installed
	examples/validate.sh

.PHONY: min-k8s prometheus-check

min-k8s: ## the oldest supported Kubernetes (1.32, ISTHMUS_K8S_VERSION): CRDs Established, a pod-bound token names its node, examples-validate and chart-lint's server dry runs and helm install, on its own control planes (first run builds it)
	e2e/cluster/min-k8s

prometheus-check: ## the chart's ServiceMonitors (auth=token) scraped by a real Prometheus on its own local cluster: every agent and operator target up, isthmus metrics queried back, 403 for a token without the role (first run builds Prometheus)
	e2e/cluster/prometheus-check

# ---- Fuzzing (needs a nightly toolchain; not part of `make test`)
.PHONY: fuzz

fuzz: ## cargo-fuzz the operator's unit and spec parsers, FUZZ_SECONDS (default 60) per target; installs cargo-fuzz into $(CACHE)/cargo-fuzz
	CACHE=$(CACHE) FUZZ_SECONDS=$(or $(FUZZ_SECONDS),60) operator/fuzz/run $(FUZZ_TARGETS)

# ---- end-to-end suite (e2e/suite) and the demo (e2e/demo), on the e2e cluster
.PHONY: e2e e2e-vm

e2e: ## cluster up (ISTHMUS_E2E_REUSE=1: a running one), images, helm install, then cargo test -p isthmus-e2e (measured in pods)
	e2e/suite/run

e2e-vm: ## on the vm provider (nodes running Debian bookworm's stock kernel): first make demo as a newcomer runs it (judged by its exit status), then latency, loss and the rest measured between pods on the same cluster
	ISTHMUS_CLUSTER_PROVIDER=vm ISTHMUS_E2E_DEMO=1 e2e/suite/run

# Not in `make test`: the scenarios' two-sided figures, which two emulated nodes on a busy 2-core machine cannot
# hold to a band (issue 27); the stock-kernel rig holds the same bands as gates.
.PHONY: fidelity
fidelity: ## the netem scenarios FIDELITY_RUNS times each (default 3) on the vm provider (tc datapath) and then the local one (userspace): a table per provider of every figure, configured band against the median measured (docs/benchmarks.md); PROVIDERS="vm" or "local" for one
	@rc=0; for p in $(or $(PROVIDERS),vm local); do \
	  ISTHMUS_CLUSTER_PROVIDER=$$p ISTHMUS_E2E_FIDELITY=$(or $(FIDELITY_RUNS),3) e2e/suite/run || rc=1; \
	done; exit $$rc

.PHONY: e2e-kind
e2e-kind: ## make e2e through kind (cluster isthmus-kind); where no Docker answers, the project's own daemon and a node image assembled here (e2e/cluster/README.md#kind); not part of make test
	ISTHMUS_CLUSTER_PROVIDER=kind ISTHMUS_CLUSTER_NAME=$${ISTHMUS_CLUSTER_NAME:-isthmus-kind} e2e/suite/run

.PHONY: bench-scale
bench-scale: ## issue 32: apply → every pair Ready at 1,000 pods on 50 nodes, 10,000 pairs, against a real API server and the real operator process (agents: a harness serving their real API; pods and nodes: API objects, no kubelet); p50/p99 and the operator's CPU and memory (docs/benchmarks.md); ARGS="--nodes 3 --pods 12 --group 3" for another shape
	e2e/scale/run $(ARGS)

.PHONY: bench-cluster
bench-cluster: ## issue 7 benchmark on a real 2-node cluster, 20 pods: apply → Ready and replacement pod Ready → impaired (table; docs/benchmarks.md); BENCH_DATAPATH=tc (default) or userspace
	ISTHMUS_E2E_BENCH=1 BENCH_DATAPATH=$(or $(BENCH_DATAPATH),tc) e2e/suite/run

demo: ## cluster up, images, isthmus, EXAMPLE (default examples/three-regions.yaml), then a table of configured vs measured per pair and direction; leaves the cluster up
	e2e/demo $(EXAMPLE)

# Not in `make test`: tables to read, one per example (the demo's one-sided checks still set the exit status).
EXAMPLES_MEASURED := examples/lossy-lte-uplink.yaml examples/dummynet-queues.yaml examples/long-fat-network.yaml examples/three-regions.yaml
.PHONY: examples-measure
examples-measure: ## make demo for each of EXAMPLES (default: the seed scenarios) on one cluster, one after another: images built once, each example's namespace deleted after its table, the cluster left up
	@rc=0; skip=$${ISTHMUS_DEMO_SKIP_IMAGES:-0}; verdicts=; \
	for f in $(or $(EXAMPLES),$(EXAMPLES_MEASURED)); do \
	  if ISTHMUS_DEMO_SKIP_IMAGES=$$skip e2e/demo $$f; then v=ok; else rc=1; v="FAILED (its table above)"; fi; \
	  skip=1; verdicts="$$verdicts  $$f: $$v"$$'\n'; \
	  ns=$$(python3 e2e/demo_links.py namespace $$f) && \
	    e2e/cluster/cluster kubectl delete namespace "$$ns" --ignore-not-found --wait --timeout=300s >/dev/null || rc=1; \
	done; printf 'examples-measure:\n%s' "$$verdicts"; exit $$rc

