PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The suite runs one test file per process, one thread each: as many processes as cores, at most 4 (mypy as
# many workers).
TEST_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

.PHONY: demo demo-fashion test lint bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	rm -f runs/demo/log.jsonl
	$(BIN)/composer-fn train --task digits --algorithms mixup,label_smoothing,channels_last --max-duration 12ep --seed 0 --log-interval 5ba \
		--log-file runs/demo/log.jsonl
	$(BIN)/composer-fn report runs/demo

# Fashion-MNIST from disk (apt-get install dataset-fashion-mnist, or DATA_DIR=<torchvision root>): two epochs of
# the mild recipe (bf16 autocast and channels-last; fp32 on a CPU without bf16 instructions, where autocast is
# slower), then the run's report.
demo-fashion: $(STAMP)
	rm -f runs/fashion/log.jsonl
	$(BIN)/composer-fn train --config recipes/fashion-mnist-mild.toml --max-duration 2ep --log-interval 50ba \
		--precision $$($(BIN)/python -c "import torch; print('bf16-mixed' if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 'fp32')") \
		--log-file runs/fashion/log.jsonl --save-folder runs/fashion $(if $(DATA_DIR),--data-dir $(DATA_DIR),)
	$(BIN)/composer-fn report runs/fashion

# mypy checks beside the suite, whose processes leave the cores idle while they start other processes and wait on
# them; its report follows the suite's, and both must pass.
test: $(STAMP)
	$(BIN)/ruff check composer_fn tests benchmarks
	out=$$(mktemp); $(BIN)/mypy --num-workers $(TEST_JOBS) > $$out 2>&1 & checker=$$!; \
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadfile; suite=$$?; \
	wait $$checker; checked=$$?; echo "mypy:"; cat $$out; rm -f $$out; \
	[ $$suite -eq 0 ] && [ $$checked -eq 0 ]

# The API reference and the guides as a site in build/site/: warnings (a public name without a docstring, a
# broken link or cross-reference) fail the build.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/engine_overhead.py
	$(BIN)/python benchmarks/step_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info
