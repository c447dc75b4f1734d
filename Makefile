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
APT_PACKAGES := prometheus-pushgateway prometheus
BENCH_APT_PACKAGES := libmagic1 util-linux
DEMO_DIR ?= demo-output

# Install the Debian packages named in $(1) that are missing (root, or sudo).
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef
DEMO_DOCS ?= 3000
DEMO_STEPS ?= 60

.PHONY: setup demo test test-fast lint bench-dataprep bench-train-memory bench-train-throughput \
	bench-checkpoint bench-upload bench-serve clean

setup: $(SETUP_STAMP)

$(SETUP_STAMP): Makefile requirements-dev.txt $(foreach s,$(SERVICES),$(s)/pyproject.toml)
	$(call apt_install,$(APT_PACKAGES))
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -r requirements-dev.txt $(foreach s,$(SERVICES),-e $(s)) -e 'services/trainer[tracking]'
	touch $(SETUP_STAMP)

demo: setup
	@mkdir -p $(DEMO_DIR)
	$(VENV)/bin/lmforge-dataprep sample-data --output $(DEMO_DIR)/sample.warc.wet.gz --docs $(DEMO_DOCS) --seed 7
	$(VENV)/bin/lmforge-dataprep run --input $(DEMO_DIR)/sample.warc.wet.gz --output $(DEMO_DIR)/dataprep \
	  --set tokenizer.vocab_size=4096 --set shards.shard_tokens=200000 --set shards.val_fraction=0.02
	OMP_NUM_THREADS=1 $(VENV)/bin/lmforge-train run --nproc 2 data.sources='[{path: $(DEMO_DIR)/dataprep}]' \
	  parallel.mode=fsdp steps=$(DEMO_STEPS) data.seq_len=128 data.batch_size=4 eval_every=20 checkpoint.every=20 \
	  log_every=10 run_dir=$(DEMO_DIR)/train
	$(VENV)/bin/lmforge-train export --checkpoint $$(ls -d $(DEMO_DIR)/train/checkpoints/step-* | tail -1) \
	  --output $(DEMO_DIR)/model
	@echo
	@echo "Data-prep report: $(DEMO_DIR)/dataprep/report.html (numbers: report.json, shards: manifest.json)"
	@echo "Training metrics: $(DEMO_DIR)/train/metrics.jsonl; model package: $(DEMO_DIR)/model"

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not slow"

lint: setup
	$(VENV)/bin/ruff check services tests bench

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

clean:
	rm -rf $(DEMO_DIR) bench/out .pytest_cache
