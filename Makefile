# One virtualenv per checkout, created on first use and reused after.
# torch is installed first and pinned: torch==2.13.0 is a CPU build on local disk,
# an unpinned torch could pull a multi-GB CUDA build.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# The end-to-end demo on a small preset (a few minutes on 2 CPU cores); the three CLIs'
# own defaults are the full-size ones (see README.md). DEMO is wiped and rebuilt each time.
DEMO   ?= demo

.PHONY: setup demo demo-udacity lint test test-dispatch bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	rm -rf $(DEMO)
	$(PY) collect.py --episodes 4 --max-steps 500 --out $(DEMO)/data
	$(PY) train.py --data $(DEMO)/data --core nac-focus --epochs 6 --out $(DEMO)/train
	$(PY) evaluate.py --checkpoint $(DEMO)/train/best.pt checkpoints/carracing_nac.pt \
		--name trained_now_on_4_short_episodes shipped_carracing_nac --episodes 2 --max-steps 600 --out $(DEMO)/eval
	@echo
	@echo "demo done:"
	@echo "  comparison  $(DEMO)/eval/comparison.md (the policy trained just now vs the shipped NAC)"
	@echo "  why the fresh one drives worse: it saw 4 short expert episodes for 6 epochs; the shipped one saw"
	@echo "  125 episodes (5 DAgger collections, fine-tuned round by round). The demo shows the pipeline, not a trained driver."
	@echo "  its episodes end at 600 steps of CarRacing's 1000, so even the shipped student's return and laps sit below"
	@echo "  the README's full-episode figures (comparison.md says so too)"
	@echo "  videos      $(DEMO)/eval/*/videos/*.mp4"
	@echo "  metrics     $(DEMO)/eval/*/metrics.json, $(DEMO)/train/metrics.json"
	@echo "  TensorBoard $(VENV)/bin/tensorboard --logdir $(DEMO)"

# The same three commands on the Udacity-style simulator's hard world (hills, hairpins, three cameras, PilotNet + NAC,
# steering and throttle, NVIDIA's autonomy): a student trained for a minute against the shipped one on unseen tracks.
demo-udacity: $(STAMP)
	rm -rf $(DEMO)-udacity
	$(PY) collect.py --env udacity-hard --episodes 4 --max-steps 400 --out $(DEMO)-udacity/data
	$(PY) train.py --data $(DEMO)-udacity/data --core nac-focus --epochs 3 --out $(DEMO)-udacity/train
	$(PY) evaluate.py --env udacity-hard --checkpoint $(DEMO)-udacity/train/best.pt checkpoints/udacity-hard_nac.pt \
		--name trained_now_on_4_short_episodes shipped_udacity-hard_nac --episodes 2 --max-steps 600 --video-episodes 1 \
		--out $(DEMO)-udacity/eval
	@echo
	@echo "demo-udacity done (the hard world, udacity-hard):"
	@echo "  comparison  $(DEMO)-udacity/eval/comparison.md (trained just now on 4 short episodes vs the shipped NAC, unseen tracks)"
	@echo "  the fresh one saw 4 x 400 steps for 3 epochs; the shipped one 80 expert episodes and a DAgger round"
	@echo "  videos      $(DEMO)-udacity/eval/*/videos/*.mp4"
	@echo "  TensorBoard $(VENV)/bin/tensorboard --logdir $(DEMO)-udacity"

# The lint and type gate: ruff's lint on every file, mypy on common/, driving_data/, policies/ and envs/ (their
# settings: pyproject.toml) and ruff's format check on FORMATTED, the files already in ruff's format; the rest keeps
# its own hand-wrapped layout (`ruff format` would turn 4,000 of its lines into 11,000). A file joins FORMATTED once
# `ruff format FILE` has been run on it, in a commit of its own. A few seconds; mypy's first run in a fresh checkout
# reads torch's, numpy's and gymnasium's types into .mypy_cache first (about 40 s on 2 cores).
FORMATTED := agent/__init__.py agent/data/__init__.py agent/evaluation/__init__.py agent/experts/__init__.py \
             agent/training/__init__.py agent/udacity/__init__.py benchmarks/__init__.py common/__init__.py \
             common/checks.py common/stops.py driving_data/__init__.py driving_data/labels.py envs/__init__.py \
             envs/privileged.py envs/replay/__init__.py envs/udacity/teacher.py envs/udacity/vehicle.py \
             policies/__init__.py tests/__init__.py tests/agent/__init__.py tests/agent/data/__init__.py \
             tests/agent/evaluation/__init__.py tests/agent/experts/__init__.py tests/agent/test_runtime.py \
             tests/agent/training/__init__.py tests/agent/udacity/__init__.py tests/benchmarks/__init__.py \
             tests/benchmarks/test_cuda_cores.py tests/benchmarks/test_pool_fine_tune.py \
             tests/benchmarks/test_steer_gain.py tests/common/__init__.py tests/common/test_files.py \
             tests/driving_data/__init__.py tests/driving_data/test_dataset.py tests/envs/__init__.py \
             tests/envs/replay/__init__.py tests/envs/replay/test_calibrate.py tests/envs/replay/test_camera.py \
             tests/envs/replay/test_vehicle.py tests/envs/test_carracing_render.py tests/envs/udacity/__init__.py \
             tests/envs/udacity/test_hard_spec.py tests/policies/__init__.py tests/policies/test_wiring.py \
             tests/test_class_names.py train.py

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check $(FORMATTED)
	$(PY) -m mypy

# lint first, so a lint or type error fails before the suite starts; then one pytest-xdist worker per core (a test
# file stays on one worker, so its module fixtures are built once); then test-dispatch
test: $(STAMP) lint
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder
	@$(MAKE) --no-print-directory test-dispatch

# The tests that compare library kernels' float outputs (the NAC layer and the policies against reference maths and
# against each other's code paths, rendered frames against stored references) once more with torch, oneDNN,
# OpenCV, numpy and libm capped one CPU dispatch level below this machine's (tests/cpu_dispatch.py: AVX-512 ->
# AVX2, AVX2 -> SSE4.1), so that a test which holds on one instruction set only fails on the developer's machine
# too. These files, not the whole suite (3 min): about 45 s on 2 idle cores.
DISPATCH_TESTS := tests/policies tests/envs/udacity/test_spec.py tests/envs/replay/test_camera.py \
                  tests/envs/test_carracing_render.py

test-dispatch: $(STAMP)
	@caps="$$($(PY) -m tests.cpu_dispatch)" && if [ -n "$$caps" ]; then \
		echo "the numeric tests again, one CPU dispatch level lower: $$caps"; \
		env $$caps $(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder $(DISPATCH_TESTS); \
	else echo "test-dispatch: this CPU has no dispatch level below its own to try"; fi

bench: $(STAMP)
	$(PY) -m benchmarks.nac_runtime
	$(PY) -m benchmarks.throughput

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
