# pdfleet: the two commands are `make demo` and `make test`. Everything they need is installed here.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
CLUSTER := $(PY) hack/localcluster.py
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: units of work (the cluster tests in two, any other module whole) run each
# in one worker, in order (docs/testing.md). Much of the suite waits on timers and processes, so more workers
# than cores pays. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 3
# e.g. GPU_CHECK_ARGS='--json gpu-check.json' (benchmarks/gpu_check.py --help)
GPU_CHECK_ARGS ?=
# Releases before the main SGLang whose real code tests run (tests/support/sglang_release.py), each in its own
# directory under ~/.cache/pdfleet.
SGLANG_RELEASES := 0.5.6.post2 0.5.7

.PHONY: help venv binaries node-deps sglang sglang-releases cluster-up cluster-down cluster-env cluster-status test test-unit test-fast lint crds bench gpu-check demo clean images images-push

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml setup.py
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11+ is required: install it, or set PYTHON=/path/to/python3.11"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "$(PYTHON) is $$($(PYTHON) -V); pdfleet needs Python 3.11+ (set PYTHON=...)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(STAMP) ## create .venv and install pdfleet with its dev extras

binaries: ## build (or reuse) etcd, kube-apiserver, controller-manager, scheduler, kubectl, kubelet, kwok, helm, kueue and crictl
	hack/build-binaries.sh

node-deps: ## install the Debian packages of the local cluster's real node (containerd, runc, CNI plugins, registry)
	hack/install-node-deps.sh

sglang: $(STAMP) ## install the real sglang (CPU, no CUDA deps) into .venv
	hack/install-sglang.sh $(PY)

# Debian packages `make images` needs on this machine (the images' own packages come from Debian's mirrors):
# mmdebstrap makes the root filesystems; umoci, runc and skopeo run and inspect the result (tests, docs/images.md).
IMAGE_DEBS := mmdebstrap umoci runc skopeo
images: $(STAMP) ## build the operator, runtime and CPU engine images (OCI archives in ~/.cache/pdfleet/images; docs/images.md)
	@missing=$$(for p in $(IMAGE_DEBS); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then echo "make images: installing $$missing"; apt-get update -q && apt-get install -y -q --no-install-recommends $$missing; \
	  else echo "make images: needs the Debian packages: $$(echo $$missing) (sudo apt-get install $$(echo $$missing)), and root (mmdebstrap, chroot)"; exit 1; fi; fi
	$(PY) -m hack.images build

images-push: ## push the images `make images` built into the local cluster's real node registry (ghcr.io/pdfleet/... there)
	$(PY) hack/realnode.py push-built

sglang-releases: $(STAMP) ## install older SGLang releases (no deps) that tests run, into ~/.cache/pdfleet/sglang-VERSION
	@for version in $(SGLANG_RELEASES); do hack/install-sglang-release.sh $$version $(PY); done

cluster-up: $(STAMP) binaries node-deps sglang ## start the local control plane with fake GPU nodes, the pod runner and Kueue (idempotent)
	$(CLUSTER) up

cluster-down: ## stop the local control plane's processes
	@$(PYTHON) hack/localcluster.py down

cluster-env: ## print the KUBECONFIG and PATH exports: eval "$$(make -s cluster-env)"
	@$(PYTHON) hack/localcluster.py env

cluster-status: ## what of the local control plane runs
	@$(PYTHON) hack/localcluster.py status

crds: $(STAMP) ## regenerate crds/ from the API models and copy them into the chart; the chart's admission warnings (patch catalogue) and pool policy (api/pool_policy.py)
	$(PY) -m pdfleet.operator.api.crd
	$(PY) hack/sync-chart-crds.py
	$(PY) -m pdfleet.operator.api.admission_warnings
	$(PY) -m pdfleet.operator.api.admission_policy

lint: $(STAMP) ## ruff and the import layering contracts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

test: $(STAMP) binaries node-deps sglang sglang-releases images ## the whole suite, against a real local control plane (started and stopped here)
	@start=$$(date +%s); started=0; \
	if [ -z "$${PDFLEET_KUBECONFIG:-}" ] && ! $(CLUSTER) status >/dev/null 2>&1; then \
	  parts=$$($(CLUSTER) status 2>&1 || true); case "$$parts" in *" running "*) ;; *) started=1;; esac; \
	  $(CLUSTER) up; fi; \
	rc=0; $(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS) || rc=$$?; \
	if [ $$started = 1 ] && [ -z "$${PDFLEET_KEEP_CLUSTER:-}" ]; then $(CLUSTER) down; fi; \
	echo "make test: $$(( $$(date +%s) - start )) s of wall time (cluster up and down included), exit $$rc"; \
	exit $$rc

test-fast: $(STAMP) sglang sglang-releases ## the inner loop: tests/unit (no cluster) on xdist workers; CI still runs `make test`
	@start=$$(date +%s); rc=0; $(PY) -m pytest tests/unit -n $(TEST_WORKERS) --dist loadscope $(PYTEST_ARGS) || rc=$$?; \
	echo "make test-fast: $$(( $$(date +%s) - start )) s of wall time, exit $$rc"; exit $$rc

test-unit: test-fast ## the same as test-fast (every test that needs no cluster is in tests/unit)

bench: $(STAMP) sglang binaries ## benchmarks: ratios against a baseline run in the same process
	@echo "== rank-health ledger: cost per scheduler loop step"; $(PY) benchmarks/bench_ledger.py
	@echo "== tool-call leak guard: cost on streamed text vs SGLang's V3.2 detector alone"; $(PY) benchmarks/bench_toolcall_guard.py
	@echo "== tool-call hold: a streamed call's delay and the handler's cpu, V4's recipe route, guarded vs bare"; $(PY) benchmarks/bench_toolcall_hold.py
	@echo "== tool-call canary: run time for 256 concurrent requests vs the same requests bare"; $(PY) benchmarks/bench_toolcall_canary.py
	@echo "== indexer kernels (Triton's interpreter) and the FP8 emulation vs the fp32 reference, small shapes on CPU"; $(PY) benchmarks/bench_indexer.py
	@echo "== bf16-index-keys: KV capacity a user gives up, DeepSeek V3.2 on SGLang's own DSATokenToKVPool, FP8 vs bf16 index keys"; $(PY) benchmarks/bench_indexer_memory.py
	@echo "== operator vs a no-logic floor: 100 pools of 8 groups, paced at 2 pools/s"; $(PY) -W error::ResourceWarning benchmarks/bench_operator.py --rate 2
	@echo "== operator vs a no-logic floor: 100 pools of 8 groups, all at once"; $(PY) -W error::ResourceWarning benchmarks/bench_operator.py
	@echo "== operator: CPU of one rank-health poll of 100 groups"; $(PY) benchmarks/bench_health_poll.py
	@echo "== local fleet: injected desync -> Desync in status, 20 injections"; $(PY) benchmarks/bench_desync_detection.py
	@echo "== token agreement (SYNC_TOKEN_IDS_ACROSS_TP, set for tp > 1): cost per decode step vs the request broadcast every iteration makes, TP 2/4/8 on gloo"; $(PY) benchmarks/bench_token_agreement.py
	@echo "== desync fixes (the six catalogue fixes): cost per decode- and prefill-loop iteration and per admission call vs SGLang's own, TP 2/4/8 on gloo"; $(PY) benchmarks/bench_desync_fixes.py
	@echo "== local fleet: the pod runner's memory and idle CPU per engine pod"; $(PY) benchmarks/bench_runner.py
	@echo "== local fleet: overlapSchedule rolled out on 2+2 groups under client load: duration, failed requests, p99 during/before"; $(PY) benchmarks/bench_rollout.py
	@echo "== operator: leader-election failover after a SIGKILL, default lease settings"; $(PY) benchmarks/bench_failover.py
	@echo "== local fleet: spec.autoscaling, a load step -> the scale decision and the new group Ready vs a plain replicas edit's; failed requests in the scale-down"; $(PY) benchmarks/bench_autoscale.py

gpu-check: $(STAMP) sglang ## on an NVIDIA GPU: the indexer kernels checked and timed at serving shapes (< 5 min; exit 2 without one)
	$(PY) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

demo: $(STAMP) binaries node-deps sglang ## the main job, locally: cluster, chart, operator, an example pool going Ready
	$(CLUSTER) up
	hack/demo.sh

clean: cluster-down ## remove the virtual environment (the binary cache in ~/.cache/pdfleet stays)
	rm -rf $(VENV) .pytest_cache .ruff_cache
