# lmforge: `make demo` runs the platform's main job locally, `make test` passes the tests.
# Both set themselves up on a fresh machine (a .venv, the services installed editable,
# the Debian packages the tests need).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SETUP_STAMP := $(VENV)/.lmforge-setup
SERVICES := services/common services/model services/pages services/trace services/dataprep services/trainer services/uploader services/inference services/canary
# lmforge.demo: `make demo`, every service as a local process (not an image).
DEMO_PACKAGE := services/demo
# lmforge.sample_data: synthetic inputs for the demo, the tests and the benchmarks (in no image).
SAMPLE_DATA_PACKAGE := services/sample-data
# Installed editable with the services: the Kubeflow pipelines (kfp v2 SDK, pinned in its pyproject;
# with the extras the steps of both pipelines need, as the step images have them).
# lmforge.tooling: the generators `make docs` runs (in no image).
TOOLING_PACKAGE := tooling
PACKAGES := $(SERVICES) pipelines $(DEMO_PACKAGE) $(SAMPLE_DATA_PACKAGE) $(TOOLING_PACKAGE)
PIPELINES_DIR ?= build/pipelines
# chromium: the HTML reports' render test (headless screenshots). g++: kenlm (the perplexity step's
# lmforge-dataprep[kenlm] extra) is a C++ extension built from its source distribution.
APT_PACKAGES := prometheus-pushgateway prometheus chromium g++
BENCH_APT_PACKAGES := libmagic1 util-linux
# Container images (docker/): the engine, the base image the tests build, the image tests.
IMAGE_APT_PACKAGES := podman runc debootstrap
DEMO_DIR ?= demo-output

# Install the Debian packages named in $(1) that are missing (root, or sudo), without their
# recommends (chromium's would bring an X stack and printer tools).
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
endef
# More demo settings: make demo DEMO_ARGS="--set train.steps=600" (docs/configuration.md, Demo).
DEMO_ARGS ?=

# -- Images (docker/README.md) --------------------------------------------------------------------
IMAGE_SERVICES := dataprep trainer uploader inference canary
IMAGE_PREFIX ?= lmforge
# The tag: the chart's appVersion, which the chart pulls by default.
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' helm/lmforge/Chart.yaml)
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || { command -v docker >/dev/null 2>&1 && echo docker; })
# Every target that uses the engine checks it first: a CONTAINER_ENGINE from the environment is
# kept by `?=`, and one that names no installed command would otherwise skip the image tests.
define check_engine
	@command -v "$(CONTAINER_ENGINE)" >/dev/null 2>&1 || { echo "CONTAINER_ENGINE=\"$(CONTAINER_ENGINE)\" is not an \
	installed command: unset it, or install podman or docker (make image-tools installs podman)" >&2; exit 1; }
endef
# "" = docker/build.sh's default (python:3.11-slim-bookworm; a CUDA PyTorch image for trainer
# and inference). `make base-image` builds LOCAL_BASE_IMAGE for machines without a registry.
BASE_IMAGE ?=
LOCAL_BASE_IMAGE ?= localhost/lmforge-base:bookworm
# auto | base | wheelhouse: where trainer and inference get torch (docker/venv.sh).
TORCH_SOURCE ?=
# podman on this kind of machine: the host's hard nofile limit is below podman's default, so
# set ulimits; runc rather than whatever OCI runtime podman would pick. Docker gets none of it.
PODMAN_FLAGS ?= $(if $(wildcard /usr/sbin/runc),--runtime /usr/sbin/runc) --ulimit nofile=1024:1024 --ulimit nproc=1024:1024
is_podman = $(filter podman,$(notdir $(CONTAINER_ENGINE)))
# Builds need no network (every install is --no-index from the build context).
CONTAINER_BUILD_FLAGS ?= --network none $(if $(is_podman),$(PODMAN_FLAGS))
CONTAINER_RUN_FLAGS ?= $(if $(is_podman),$(PODMAN_FLAGS))
image_env = CONTAINER_ENGINE="$(CONTAINER_ENGINE)" CONTAINER_BUILD_FLAGS="$(CONTAINER_BUILD_FLAGS)" \
	CONTAINER_RUN_FLAGS="$(CONTAINER_RUN_FLAGS)" LOCAL_BASE_IMAGE="$(LOCAL_BASE_IMAGE)" VERSION="$(VERSION)"

.PHONY: help setup system-packages demo demo-stop docs test test-fast lint pipelines bench-dataprep bench-quality-steps \
	bench-dataprep-scaling bench-dataprep-crawl bench-html-extraction bench-train-memory \
	bench-train-throughput bench-checkpoint bench-weights bench-trace bench-upload bench-serve bench-serve-engine bench-serve-split bench-gpu clean
.DEFAULT_GOAL := help

# Every target with a `## ` note, one line each (image-SERVICE's note is its own `## ` line).
help: ## this list (a bare `make` prints it)
	@echo "make TARGET, on a fresh Debian/Ubuntu machine too (each sets itself up):"
	@sed -n -e 's/^\([a-z][a-z-]*\):.*## \(.*\)$$/\1\t\2/p' -e 's/^## \([a-zA-Z-]*\): \(.*\)$$/\1\t\2/p' \
	  $(firstword $(MAKEFILE_LIST)) | awk -F '\t' '{ printf "  %-24s %s\n", $$1, $$2 }'

setup: $(SETUP_STAMP) ## a .venv with every service installed editable, and the Debian packages

# The Debian packages the tests and the demo need, installed when missing (checked on every setup).
system-packages: ## the Debian packages the tests and the demo need (apt, sudo when not root)
	$(call apt_install,$(APT_PACKAGES))

$(SETUP_STAMP): Makefile requirements-dev.txt $(foreach s,$(PACKAGES),$(s)/pyproject.toml) | system-packages
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt $(foreach s,$(PACKAGES),-e $(s)) -e 'services/trainer[tracking,eval]' \
	  -e 'services/dataprep[kenlm]' -e 'pipelines[data,train]'
	touch $(SETUP_STAMP)

# The whole platform on this machine (services/demo): corpus, data pipeline (kfp.local), FSDP training
# with the uploader and one planned interruption, serving, canary, Prometheus. Servers stay up until
# Ctrl-C; `make demo-stop` ends what a killed demo left running.
demo: setup ## the whole platform on this machine (README: Quickstart)
	$(VENV)/bin/lmforge-demo run --set workdir=$(DEMO_DIR) $(DEMO_ARGS)

demo-stop: ## stop what a killed demo left running
	@if [ -x $(VENV)/bin/lmforge-demo ]; then $(VENV)/bin/lmforge-demo stop --workdir $(DEMO_DIR); \
	else echo "nothing to stop (no $(VENV))"; fi

# The configuration reference (docs/configuration.md) and the chart's values.schema.json, regenerated
# from the services' pydantic models (and, for the chart-level values, lmforge.tooling.chart_values);
# then the documentation site (mkdocs.yml), strict: a broken link or a page left out of the nav fails.
docs: setup ## regenerate the configuration reference, the chart's values schema and data-prep stage list; build the site into build/site
	$(PY) -m lmforge.tooling.config_reference --write docs/configuration.md
	$(PY) -m lmforge.tooling.values_schema --write helm/lmforge/values.schema.json
	$(PY) -m lmforge.tooling.dataprep_stages --write helm/lmforge/dataprep-stages.json
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

test: setup image-tools ## every test, the image builds included (pytest lists the 25 slowest)
	$(check_engine)
	$(image_env) $(PY) -m pytest -q

test-fast: setup ## the tests not marked slow (no end-to-end demo, no image builds)
	$(PY) -m pytest -q -m "not slow"

# The image tests alone (every service image, built on the local base image; `make test` runs them too).
test-images: setup image-tools ## build every service image and run the image tests
	$(check_engine)
	$(image_env) $(PY) -m pytest -q -m images tests/images

lint: setup ## ruff over services, tooling, tests, bench, pipelines, docker
	$(VENV)/bin/ruff check services tooling tests bench pipelines docker

# The data and train pipelines as KFP IR YAML, for upload in the Kubeflow Pipelines UI (the step
# images are lmforge/<service>:<tag>; set LMFORGE_IMAGE_REGISTRY / LMFORGE_IMAGE_TAG to change them).
pipelines: setup ## compile the Kubeflow pipelines to build/pipelines/*.yaml
	$(PY) -m lmforge_pipelines.compile --output $(PIPELINES_DIR)

bench-dataprep: setup ## data prep against Hugging Face datatrove on the same input (docs/benchmarks.md)
	$(call apt_install,$(BENCH_APT_PACKAGES))
	$(PY) bench/dataprep_bench.py

bench-quality-steps: setup ## docs/s and MB/s per core of each filter step (URL, FineWeb, C4, toxicity, Gopher, ...)
	$(PY) bench/quality_steps.py

bench-dataprep-scaling: setup ## data prep at 1 and 2 workers, per-task memory and disk at 1x/4x/16x (then bench-dataprep-crawl writes docs/scaling.md)
	$(call apt_install,$(BENCH_APT_PACKAGES))
	$(PY) bench/dataprep_scaling.py

# The components memory run: a random duplicate graph of small components, 16x the edges of
# bench-dataprep-scaling's corpus on 16 tasks (the model's bytes per record).
bench-dataprep-crawl: setup ## a 100 TB crawl's task structure at 1x/4x/16x inputs on moto S3: requests per task and prefix; docs/scaling.md
	$(PY) bench/dataprep_crawl_structure.py
	$(PY) bench/components_memory.py --edges 1152000 --nodes 4608000 --tasks 16 --json bench/out/components-memory.json
	$(PY) bench/scale_model.py --write docs/scaling.md

bench-html-extraction: setup ## WARC HTML main-text extraction: token precision/recall/F1 and pages/s per core of each extractor
	$(PY) bench/html_extraction.py

bench-train-loader: setup ## bytes fetched per byte trained and the data-wait share, block-window against global shuffle (corpus 100x the cache, 20 ms proxy)
	$(PY) bench/train_loader_amplification.py

bench-train-memory: setup ## per-rank training memory, DDP against FSDP2
	$(PY) bench/train_memory.py

bench-train-throughput: setup ## training tokens/s, and the trainer's overhead over a bare loop
	$(PY) bench/train_throughput.py

bench-checkpoint: setup ## how long a checkpoint blocks a training step, async against sync
	$(PY) bench/checkpoint_stall.py

bench-weights: setup ## what weights-only packages (checkpoint.weights_every) cost the training step: mean step time on/off
	$(PY) bench/weights_overhead.py

bench-trace: setup ## the trace index at 1x/4x/16x of 100 M tokens of real text: build tokens/s/core, bytes/token, memory per task; trace latency at 100 M and 1 B tokens
	$(PY) bench/trace_index.py

bench-upload: setup ## the checkpoint uploader against boto3's upload_file
	$(PY) bench/upload_bench.py

bench-serve: setup ## lmforge-serve under concurrent streaming load: tokens/s, TTFT, TPOT
	$(PY) bench/serve/serve_bench.py

bench-serve-engine: setup ## the paged inference engine against today's (a git revision), same KV memory: sequences admitted, tokens/s, long-prompt stall, prefix caching
	$(PY) bench/serve/engine_bench.py

bench-serve-split: setup ## lmforge-serve of a git revision (main before the engine-core process) against the working tree's, over HTTP: tokens/s, TTFT/TPOT p50/p99, server CPU per token, 1/16/64 clients
	$(PY) bench/serve/engine_split_bench.py

# Every GPU figure in docs/benchmarks.md, on a machine with CUDA devices (fails fast without one).
bench-gpu: setup ## every GPU figure: training MFU (350m, llama-350m, llama-1b, beside the planner's and added to its calibration; llama-1b Float8 and activation checkpointing), serving vs HF generate
	$(PY) bench/train_throughput.py --suite gpu
	$(PY) bench/record_calibration.py bench/out/train-throughput-gpu.json
	$(PY) bench/train_memory.py --device cuda --preset 350m --ranks 1
	$(PY) bench/train_document_masking.py
	$(PY) bench/serve/serve_bench.py --suite gpu
	$(PY) bench/serve/hf_generate_bench.py
	$(PY) bench/serve/serve_vs_hf.py

# -- Images ---------------------------------------------------------------------------------------
.PHONY: test-images image-tools base-image images image-locks $(addprefix image-,$(IMAGE_SERVICES))

image-tools: ## podman, runc and debootstrap (apt), for the images and their tests
	$(call apt_install,$(IMAGE_APT_PACKAGES))

# Debian bookworm + python3 from debootstrap, imported as $(LOCAL_BASE_IMAGE) (once).
base-image: image-tools ## a local Debian bookworm base image, for machines without a registry
	$(check_engine)
	CONTAINER_ENGINE="$(CONTAINER_ENGINE)" docker/make-base-image.sh $(LOCAL_BASE_IMAGE)

# Every service image, tagged $(IMAGE_PREFIX)/SERVICE:$(VERSION). Without a registry:
#   make base-image images BASE_IMAGE=localhost/lmforge-base:bookworm
images: $(addprefix image-,$(IMAGE_SERVICES)) ## every service image, tagged IMAGE_PREFIX/SERVICE:VERSION (docker/README.md)

## image-SERVICE: one service image (dataprep, trainer, uploader, inference, canary)
# (docker/service.Dockerfile, the service's stage; docker/build.sh sets its build arguments)
$(addprefix image-,$(IMAGE_SERVICES)): image-%: setup
	$(check_engine)
	CONTAINER_ENGINE="$(CONTAINER_ENGINE)" CONTAINER_BUILD_FLAGS="$(CONTAINER_BUILD_FLAGS)" BASE_IMAGE="$(BASE_IMAGE)" \
	  TORCH_SOURCE="$(TORCH_SOURCE)" VERSION="$(VERSION)" PYTHON=$(PY) \
	  docker/build.sh $* $(IMAGE_PREFIX)/$*:$(VERSION)

# Re-resolve docker/locks/*.lock (the exact third-party versions of each image) from the
# services' pyproject.toml with this machine's pip configuration.
image-locks: setup ## re-resolve docker/locks/*.lock from the services' pyproject.toml
	$(PY) docker/wheelhouse.py lock

clean: ## remove the demo output, bench output, built pipelines and images' build folder
	rm -rf $(DEMO_DIR) bench/out .pytest_cache build/images $(PIPELINES_DIR)
