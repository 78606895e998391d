"""Prompts from a problem set (bundled or a local JSONL/Parquet file), tokenized with the model's
own HF tokenizer (from `model.hf_checkpoint`), drawn in a seeded order that a checkpoint restores.

The completion text goes to the reward pool as it is: the pool extracts the code (fenced blocks,
the last block, or plain code) and runs the problem's tests on it in the sandbox.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from megatron_rl.data.problems import Problem, load_problems


@dataclass(frozen=True)
class ProblemPrompt:
    problem: Problem
    prompt_ids: list[int]


class ProblemTask:
    def __init__(
        self,
        problems: list[Problem],
        tokenizer,
        seed: int = 0,
        max_prompt_tokens: int = 2048,
        shuffle: bool = True,
    ):
        if not problems:
            raise ValueError("the problem set is empty")
        self.problems, self.tok = problems, tokenizer
        self.max_prompt_tokens, self.shuffle = max_prompt_tokens, shuffle
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.drawn = 0

    @classmethod
    def from_config(cls, cfg) -> ProblemTask:
        if not cfg.model.hf_checkpoint:
            raise SystemExit(
                f"data.source={cfg.data.source!r} needs the model's tokenizer: set model.hf_checkpoint to an "
                "HF directory that holds tokenizer files (or use data.source=synthetic)"
            )
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint)
        return cls(
            load_problems(cfg.data.source), tok, cfg.data.seed, cfg.data.max_prompt_tokens, cfg.data.shuffle
        )

    def _next_index(self) -> int:
        if not self.order:  # a new epoch
            self.order = list(range(len(self.problems)))
            if self.shuffle:
                self.rng.shuffle(self.order)
        return self.order.pop(0)

    def draw(self, n: int) -> list[ProblemPrompt]:
        out = []
        for _ in range(n):
            p = self.problems[self._next_index()]
            ids = (
                self.tok.apply_chat_template(
                    [{"role": "user", "content": p.prompt}], add_generation_prompt=True, tokenize=True
                )
                if self.tok.chat_template
                else self.tok.encode(p.prompt)
            )
            if len(ids) > self.max_prompt_tokens:
                raise ValueError(
                    f"problem {p.id!r}: prompt has {len(ids)} tokens > data.max_prompt_tokens="
                    f"{self.max_prompt_tokens}; raise it or drop the problem"
                )
            out.append(ProblemPrompt(p, list(ids)))
            self.drawn += 1
        return out

    def state(self) -> dict:
        return {"rng": self.rng.getstate(), "order": self.order, "drawn": self.drawn}

    def load_state(self, state: dict) -> None:
        v = state["rng"]
        self.rng.setstate((v[0], tuple(v[1]), v[2]))
        self.order, self.drawn = list(state["order"]), state["drawn"]

    def program(self, completion_ids: list[int]) -> str:
        return self.tok.decode(completion_ids, skip_special_tokens=True)

    def problem(self, prompt: ProblemPrompt) -> Problem:
        return prompt.problem
