"""The record every reward comes back as, sandboxed or not, and how a test count becomes a reward.

One shape for all rewards lets the training loop, the logs and `megatron-rl score` treat a unit-test
run and an in-process verifier alike: a float to learn from, a status to count failure kinds by
(a spike of `timeout` or `syntax_error` says more than a mean reward does), and the tail of what the
program printed for a human reading one bad sample.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from megatron_rl.config.choices import REWARD_MODES

# Every status a result can carry. `passed` is the only one a full reward may come with.
PASSED = "passed"
FAILED = "failed"  # ran to the end; at least one test failed
TIMEOUT = "timeout"  # wall-clock deadline or CPU-seconds limit
CRASHED = "crashed"  # died, exited early, raised at import, or broke an output/protocol limit
MEMORY = "memory"  # ran out of its address-space limit
SYNTAX_ERROR = "syntax_error"  # the extracted code does not compile
NO_CODE = "no_code"  # no code could be extracted from the completion
SANDBOX_ERROR = "sandbox_error"  # our side failed (sandbox died, malformed problem): not the sample's fault
ENV_ERROR = "env_error"  # a multi-turn environment raised (env/types.py step_safely): the trajectory ended
# reward.kind=model: no verifier ran; the learned reward model's score is the reward (loop/step/ppo.py)
MODEL_SCORED = "model_scored"

STATUSES = (
    PASSED, FAILED, TIMEOUT, CRASHED, MEMORY, SYNTAX_ERROR, NO_CODE, SANDBOX_ERROR, ENV_ERROR, MODEL_SCORED,
)  # fmt: skip

# What it most likely means when (nearly) every sample of a run ends with one status: the cause a run
# that cannot learn names (loop/record/signal.py). Each says what the samples did, then where to look.
LIKELY_CAUSE = {
    PASSED: "every completion passes its tests: the problems are too easy to learn from",
    FAILED: "the programs run and fail their tests: the problems are too hard for this model, or the "
    "tests are wrong (megatron-rl score a known-good solution)",
    TIMEOUT: "the programs run past their time limit (reward.timeout_s): an endless loop, a slow "
    "solution, or a limit too short for the tests",
    CRASHED: "the programs crash or raise before their tests finish",
    MEMORY: "the programs run out of memory (reward.memory_mb)",
    SYNTAX_ERROR: "the code taken from the completions does not compile",
    NO_CODE: "the completions hold no code block (ask for one with data.system_prompt, or start from a "
    "model that writes code)",
    SANDBOX_ERROR: "the sandbox itself fails, not the samples (log.txt says why)",
    ENV_ERROR: "the multi-turn environment (rollout.env) raises on every trajectory (samples.jsonl keeps "
    "each error)",
    MODEL_SCORED: "only the reward model scores (reward.kind=model), and it gives every sample of a group "
    "the same score: check that reward.model_checkpoint is a trained reward model",
}


@dataclass
class RewardResult:
    """The outcome of scoring one completion.

    `tests_passed`/`tests_total` are what the trusted side of the harness counted; `reward` is derived
    from them and the configured mode, never reported by the program under test.
    """

    sample_id: Any
    reward: float
    status: str
    seconds: float = 0.0
    output_tail: str = ""
    tests_passed: int = 0
    tests_total: int = 0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown reward status {self.status!r}; expected one of {STATUSES}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def reward_from_counts(status: str, passed: int, total: int, mode: str) -> float:
    """The reward for `passed` of `total` tests under `mode`.

    all_or_nothing: 1 only when the run ended `passed` (every test ran and passed). fraction: the share
    of tests passed, so a program that passes 3 of 4 tests and then hangs still earns 0.75; statuses
    that mean no test could run (no code, syntax error, sandbox error) earn 0 either way.
    """
    if mode not in REWARD_MODES:
        raise ValueError(f"reward mode must be one of {REWARD_MODES}; got {mode!r}")
    if status in (NO_CODE, SYNTAX_ERROR, SANDBOX_ERROR) or total <= 0:
        return 0.0
    if mode == "all_or_nothing":
        return 1.0 if status == PASSED and passed == total else 0.0
    return max(0, min(passed, total)) / total
