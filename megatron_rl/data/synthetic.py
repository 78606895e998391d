"""The tiny recipe's synthetic coding task: write a Python expression that evaluates to a target.

A prompt is `<bos>` + the target's digits + `=`; the completion is an expression over digits and
`+ - *`, ended by `<eos>`. The completion becomes the program `ans = <completion>` and is scored in
the real sandbox by four asserts with partial credit (reward.mode=fraction):

    assert isinstance(ans, int)        # a well-formed integer expression
    assert abs(ans - T) <= 4
    assert abs(ans - T) <= 1
    assert ans == T

A randomly initialised model writes a valid, roughly right expression now and then (a lone digit
and `<eos>` already scores), so GRPO has signal from the first step; learning to stop early, to
stay near the target and then to hit it raises the reward step by step. Small enough to learn
from scratch on 2 CPU cores in minutes, yet every reward goes through untrusted-code execution.

The character tokenizer is the task's own: the engines run with `skip_tokenizer_init` and token-id
prompts, so no HF tokenizer files are needed.

With `data.hidden_target` the prompt is `<bos>=` alone: the first turn can only guess, and only the
multi-turn environment's feedback ("15=12=": the value, then the target, env/code_feedback.py) tells
the target, so a policy that learns to use feedback solves at its second turn.

A long-tailed variant (`data.tail_share` > 0) measures what the longest completions cost
(benchmarks/async.py): a share `tail_share` of the prompts may be answered in up to
rollout.max_new_tokens tokens, the others are capped at `data.short_answer_tokens` (each prompt's
`max_new_tokens`, which the engine honours per request). The tiny policy does not choose its length
from the prompt, so it is the cap that makes the tail: with no stop id, every sample runs to its cap.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SPECIALS = ("<pad>", "<bos>", "<eos>")
CHARS = "0123456789+-*="


@dataclass(frozen=True)
class CharTokenizer:
    chars: str = CHARS

    @property
    def vocab(self) -> list[str]:
        return list(SPECIALS) + list(self.chars)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.chars)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    def encode(self, text: str) -> list[int]:
        try:
            return [len(SPECIALS) + self.chars.index(c) for c in text]
        except ValueError as e:
            bad = next(c for c in text if c not in self.chars)
            raise ValueError(f"character {bad!r} is not in the task vocabulary {self.chars!r}") from e

    def decode(self, ids: list[int]) -> str:
        """Text of a completion: specials are dropped at <eos>; other specials decode to '?'."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            out.append(self.chars[i - len(SPECIALS)] if i >= len(SPECIALS) and i < self.vocab_size else "?")
        return "".join(out)


@dataclass(frozen=True)
class ArithmeticPrompt:
    target: int
    prompt_ids: list[int]
    problem_id: str
    max_new_tokens: int | None = None  # this prompt's answer cap (None: rollout.max_new_tokens)


TESTS_TEMPLATE = (
    "assert isinstance(ans, int)\nassert abs(ans - {t}) <= 4\nassert abs(ans - {t}) <= 1\nassert ans == {t}\n"
)


class ArithmeticTask:
    """Endless prompts with targets in [0, max_target], drawn from a seeded generator."""

    def __init__(
        self,
        seed: int = 0,
        max_target: int = 20,
        tokenizer: CharTokenizer | None = None,
        tail_share: float = 0.0,
        short_answer_tokens: int = 4,
        hidden_target: bool = False,
    ):
        self.tok = tokenizer or CharTokenizer()
        self.hidden_target = hidden_target
        self.max_target = max_target
        self.tail_share, self.short_answer_tokens = tail_share, short_answer_tokens
        self.rng = random.Random(seed)
        self.drawn = 0

    def draw(self, n: int) -> list[ArithmeticPrompt]:
        out = []
        for _ in range(n):
            t = self.rng.randint(0, self.max_target)
            cap = None  # without a tail, every answer may run to rollout.max_new_tokens
            if self.tail_share > 0 and self.rng.random() >= self.tail_share:
                cap = self.short_answer_tokens
            out.append(self._prompt(t, f"arith-{self.drawn}", cap))
            self.drawn += 1
        return out

    def _prompt(self, target: int, problem_id: str, cap: int | None) -> ArithmeticPrompt:
        ids = [self.tok.bos_id, *self.tok.encode("=" if self.hidden_target else f"{target}=")]
        return ArithmeticPrompt(target=target, prompt_ids=ids, problem_id=problem_id, max_new_tokens=cap)

    def prompt_record(self, prompt: ArithmeticPrompt) -> dict:
        """A drawn prompt as JSON (a checkpoint's carried groups: loop/step/carry.py)."""
        return {
            "target": prompt.target,
            "problem_id": prompt.problem_id,
            "max_new_tokens": prompt.max_new_tokens,
        }

    def prompt_from_record(self, record: dict) -> ArithmeticPrompt:
        return self._prompt(int(record["target"]), str(record["problem_id"]), record["max_new_tokens"])

    def state(self) -> dict:
        """Everything needed to continue the prompt stream exactly (for checkpoints)."""
        return {"rng": self.rng.getstate(), "drawn": self.drawn}

    def load_state(self, state: dict) -> None:
        v = state["rng"]
        self.rng.setstate((v[0], tuple(v[1]), v[2]))
        self.drawn = state["drawn"]

    def text(self, ids: list[int]) -> str:
        """Token ids as a person reads them, the specials by name ("<bos>12=", "3+9<eos>"): a prompt or a
        completion as the model saw or wrote it (the run's samples.jsonl)."""
        vocab = self.tok.vocab
        return "".join(vocab[i] if 0 <= i < len(vocab) else "?" for i in ids)

    def program(self, completion_ids: list[int]) -> str:
        """The untrusted program a completion becomes."""
        return f"ans = {self.tok.decode(completion_ids)}\n"

    def turn_text(self, ids: list[int]) -> str:
        """A multi-turn trajectory's turn as its environment reads it (rollout/turns.py): the expression."""
        return self.tok.decode(list(ids))

    def problem(self, prompt: ArithmeticPrompt):
        """The reward problem (tests as Python source) for one prompt."""
        from megatron_rl.reward.problem import Problem

        return Problem(
            id=prompt.problem_id,
            prompt=f"{prompt.target}=",
            tests=TESTS_TEMPLATE.format(t=prompt.target),
            answer=str(prompt.target),  # what a failing `assert ans == T` shows (env/code_feedback.py)
            entry_point=None,
            timeout_s=5.0,
        )
