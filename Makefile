# lmforge: `make demo` runs the platform's main job locally, `make test` passes the tests.
# Both set themselves up on a fresh machine (a .venv, the services installed editable,
# the Debian packages the tests need).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
SETUP_STAMP := $(VENV)/.lmforge-setup
SERVICES := services/common services/dataprep services/trainer services/uploader services/inference services/canary
# lmforge.demo: `make demo`, every service as a local process (not an image).
DEMO_PACKAGE := services/demo
# Installed editable with the services: the Kubeflow pipelines (kfp v2 SDK, pinned in its pyproject).
PACKAGES := $(SERVICES) pipelines $(DEMO_PACKAGE)
PIPELINES_DIR ?= build/pipelines
APT_PACKAGES := prometheus-pushgateway prometheus
BENCH_APT_PACKAGES := libmagic1 util-linux
# Container images (docker/): the engine, the base image the tests build, the image tests.
IMAGE_APT_PACKAGES := podman runc debootstrap
DEMO_DIR ?= demo-output

# Install the Debian packages named in $(1) that are missing (root, or sudo).
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef
# More demo settings: make demo DEMO_ARGS="--set train.steps=600" (README: configuration reference).
DEMO_ARGS ?=

# -- Images (docker/README.md) --------------------------------------------------------------------
IMAGE_SERVICES := dataprep trainer uploader inference canary
IMAGE_PREFIX ?= lmforge
# The tag: the chart's appVersion, which the chart pulls by default.
VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' helm/lmforge/Chart.yaml)
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || { command -v docker >/dev/null 2>&1 && echo docker; })
# "" = each Dockerfile's default (python:3.11-slim-bookworm; a CUDA PyTorch image for trainer
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

.PHONY: setup system-packages demo demo-stop docs test test-fast lint pipelines bench-dataprep bench-train-memory bench-train-throughput \
	bench-checkpoint bench-upload bench-serve clean

setup: $(SETUP_STAMP)

# The Debian packages the tests and the demo need, installed when missing (checked on every setup).
system-packages:
	$(call apt_install,$(APT_PACKAGES))

$(SETUP_STAMP): Makefile requirements-dev.txt $(foreach s,$(PACKAGES),$(s)/pyproject.toml) | system-packages
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt $(foreach s,$(PACKAGES),-e $(s)) -e 'services/trainer[tracking]'
	touch $(SETUP_STAMP)

# The whole platform on this machine (services/demo): corpus, data pipeline (kfp.local), FSDP training
# with the uploader and one planned interruption, serving, canary, Prometheus. Servers stay up until
# Ctrl-C; `make demo-stop` ends what a killed demo left running.
demo: setup
	$(VENV)/bin/lmforge-demo run --set workdir=$(DEMO_DIR) $(DEMO_ARGS)

demo-stop:
	@if [ -x $(VENV)/bin/lmforge-demo ]; then $(VENV)/bin/lmforge-demo stop --workdir $(DEMO_DIR); \
	else echo "nothing to stop (no $(VENV))"; fi

# The README's configuration reference, regenerated from the services' pydantic models.
docs: setup
	$(PY) -m lmforge.common.config_reference --readme README.md

test: setup image-tools
	$(image_env) $(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

# The image tests alone (every service image, built on the local base image; `make test` runs them too).
test-images: setup image-tools
	$(image_env) $(PY) -m pytest -q -m images tests/images

lint: setup
	$(VENV)/bin/ruff check services tests bench pipelines docker

# The data and train pipelines as KFP IR YAML, for upload in the Kubeflow Pipelines UI (the step
# images are lmforge/<service>:<tag>; set LMFORGE_IMAGE_REGISTRY / LMFORGE_IMAGE_TAG to change them).
pipelines: setup
	$(PY) -m lmforge_pipelines.compile --output $(PIPELINES_DIR)

bench-dataprep: setup
	$(call apt_install,$(BENCH_APT_PACKAGES))
	$(PY) bench/dataprep_bench.py

bench-train-memory: setup
	$(PY) bench/train_memory.py

bench-train-throughput: setup
	$(PY) bench/train_throughput.py

bench-checkpoint: setup
	$(PY) bench/checkpoint_stall.py

bench-upload: setup
	$(PY) bench/upload_bench.py

bench-serve: setup
	$(PY) bench/serve/serve_bench.py

# -- Images ---------------------------------------------------------------------------------------
.PHONY: test-images image-tools base-image images image-locks $(addprefix image-,$(IMAGE_SERVICES))

image-tools:
	$(call apt_install,$(IMAGE_APT_PACKAGES))

# Debian bookworm + python3 from debootstrap, imported as $(LOCAL_BASE_IMAGE) (once).
base-image: image-tools
	CONTAINER_ENGINE="$(CONTAINER_ENGINE)" docker/make-base-image.sh $(LOCAL_BASE_IMAGE)

# Every service image, tagged $(IMAGE_PREFIX)/SERVICE:$(VERSION). Without a registry:
#   make base-image images BASE_IMAGE=localhost/lmforge-base:bookworm
images: $(addprefix image-,$(IMAGE_SERVICES))

$(addprefix image-,$(IMAGE_SERVICES)): image-%: setup
	@test -n "$(CONTAINER_ENGINE)" || { echo "no podman or docker: install one (make image-tools installs podman)" >&2; exit 1; }
	CONTAINER_ENGINE="$(CONTAINER_ENGINE)" CONTAINER_BUILD_FLAGS="$(CONTAINER_BUILD_FLAGS)" BASE_IMAGE="$(BASE_IMAGE)" \
	  TORCH_SOURCE="$(TORCH_SOURCE)" VERSION="$(VERSION)" PYTHON=$(PY) \
	  docker/build.sh $* $(IMAGE_PREFIX)/$*:$(VERSION)

# Re-resolve docker/locks/*.lock (the exact third-party versions of each image) from the
# services' pyproject.toml with this machine's pip configuration.
image-locks: setup
	$(PY) docker/wheelhouse.py lock

clean:
	rm -rf $(DEMO_DIR) bench/out .pytest_cache build/images $(PIPELINES_DIR)
