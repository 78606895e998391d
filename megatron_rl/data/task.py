"""Prompts from a problem set (`data.source`: bundled, a JSONL/JSON/Parquet file, a saved `datasets`
folder, a folder or glob of files; `data.columns` maps the data's column names), tokenized with the
model's own HF tokenizer (from `model.hf_checkpoint`), drawn in a seeded order that a checkpoint restores.

`data.system_prompt` (an instruction such as "answer with one Python program in a fenced block") goes
before each prompt: as a system message when the tokenizer has a chat template, else as plain text
followed by a blank line, so a base model still sees it. A chat template that refuses system
messages is an error at the first draw, naming the setting to unset.

The completion text goes to the reward pool as it is: the pool extracts the code (fenced blocks,
the last block, or plain code) and runs the problem's tests on it in the sandbox.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from megatron_rl.data.problems import load_problems
from megatron_rl.reward.problem import Problem


@dataclass(frozen=True)
class ProblemPrompt:
    problem: Problem
    prompt_ids: list[int]
    index: int = -1  # the problem's position in the task's problem list


class ProblemTask:
    def __init__(
        self,
        problems: list[Problem],
        tokenizer,
        seed: int = 0,
        max_prompt_tokens: int = 2048,
        shuffle: bool = True,
        system_prompt: str = "",
    ):
        if not problems:
            raise ValueError("the problem set is empty")
        self.problems, self.tok = problems, tokenizer
        self.system_prompt = system_prompt
        self.max_prompt_tokens, self.shuffle = max_prompt_tokens, shuffle
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.drawn = 0

    @classmethod
    def from_config(cls, cfg, tokenizer=None, problems: list[Problem] | None = None) -> ProblemTask:
        """The recipe's problems (read from data.source unless given: a run's ranks get them from job
        rank 0, loop/step/components.py `read_problems`) with the model's tokenizer (loaded from
        model.hf_checkpoint unless given; the recipe check refuses a problem source without one)."""
        if tokenizer is None and not cfg.model.hf_checkpoint:
            raise SystemExit(
                f"data.source={cfg.data.source!r} needs the model's tokenizer: set model.hf_checkpoint to an "
                "HF directory that holds tokenizer files (or use data.source=synthetic)"
            )
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(cfg.model.hf_checkpoint)
        d = cfg.data
        if problems is None:
            problems = load_problems(d.source, d.columns)
        return cls(problems, tokenizer, d.seed, d.max_prompt_tokens, d.shuffle, d.system_prompt)

    def _next_index(self) -> int:
        if not self.order:  # a new epoch
            self.order = list(range(len(self.problems)))
            if self.shuffle:
                self.rng.shuffle(self.order)
        return self.order.pop(0)

    def draw(self, n: int) -> list[ProblemPrompt]:
        out = []
        for _ in range(n):
            index = self._next_index()
            p = self.problems[index]
            ids = self.encode_prompt(p.prompt)
            if len(ids) > self.max_prompt_tokens:
                raise ValueError(
                    f"problem {p.id!r}: prompt has {len(ids)} tokens > data.max_prompt_tokens="
                    f"{self.max_prompt_tokens}; raise it or drop the problem"
                )
            out.append(ProblemPrompt(p, list(ids), index))
            self.drawn += 1
        return out

    def encode_prompt(self, prompt: str) -> list[int]:
        """The prompt's token ids as the model sees them: chat template and system prompt applied."""
        if not self.tok.chat_template:
            text = f"{self.system_prompt}\n\n{prompt}" if self.system_prompt else prompt
            return list(self.tok.encode(text))
        messages = [{"role": "user", "content": prompt}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        try:
            # transformers 5 returns a BatchEncoding (a dict) unless told otherwise
            ids = self.tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as e:  # jinja2's TemplateError: templates raise on roles they do not take
            if not self.system_prompt:
                raise
            raise ValueError(
                f"the tokenizer's chat template refused the system message ({e}); unset data.system_prompt "
                "or put the instruction in the prompts themselves"
            ) from None
        return list(ids)

    def state(self) -> dict:
        # A copy: drawing pops from the live order, and a saved state must not move with it (an
        # asynchronous run keeps the state from before batches drawn ahead: loop/placement/feed.py).
        return {"rng": self.rng.getstate(), "order": list(self.order), "drawn": self.drawn}

    def load_state(self, state: dict) -> None:
        v = state["rng"]
        self.rng.setstate((v[0], tuple(v[1]), v[2]))
        self.order, self.drawn = list(state["order"]), state["drawn"]

    def prompt_record(self, prompt: ProblemPrompt) -> dict:
        """A drawn prompt as JSON (a checkpoint's carried groups: loop/step/carry.py): its problem's position
        and id, checked on load against the problem list the resumed run reads."""
        return {"index": prompt.index, "id": prompt.problem.id}

    def prompt_from_record(self, record: dict) -> ProblemPrompt:
        index = int(record["index"])
        if not 0 <= index < len(self.problems) or self.problems[index].id != record["id"]:
            raise ValueError(
                f"the checkpoint carries problem {record['id']!r} at position {index}, which this run's "
                f"data.source ({len(self.problems)} problems) does not hold there: resume with the data the "
                "run started with"
            )
        p = self.problems[index]
        return ProblemPrompt(p, list(self.encode_prompt(p.prompt)), index)

    def program(self, completion_ids: list[int]) -> str:
        return self.tok.decode(completion_ids, skip_special_tokens=True)

    def turn_text(self, ids: list[int]) -> str:
        """A multi-turn trajectory's turn as its environment reads it (rollout/turns.py)."""
        return self.tok.decode(list(ids), skip_special_tokens=True)

    def text(self, ids: list[int]) -> str:
        """Token ids as the model saw or wrote them, special tokens included (the chat template's, the end
        id): a prompt or a completion in the run's samples.jsonl."""
        return self.tok.decode(list(ids), skip_special_tokens=False)

    def problem(self, prompt: ProblemPrompt) -> Problem:
        return prompt.problem
