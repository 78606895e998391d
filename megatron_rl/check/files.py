"""What the recipe check reads beyond the recipe itself: paths on this machine, the checkpoint's end
ids, and the problem set through the model's tokenizer.

Part of the one recipe check (check/recipe.py). Paths that cannot be read here are problems of kind "files":
the driver refuses them; `validate` and `submit` refuse them where the job will read them from here and
note them elsewhere (the cluster's storage may hold them; check/recipe.py `blocking`). A relative path a
recipe file writes is already read from the recipe's folder (config/paths.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from megatron_rl.check.ranges import get_key
from megatron_rl.config.problem import Problem
from megatron_rl.config.schema import RecipeConfig

MAX_PROMPTS_CHECKED = 20_000  # prompts `validate` tokenizes to check their length


def prompt_problems(cfg: RecipeConfig) -> list[Problem]:
    """The problem set as the driver will read it, through the model's tokenizer and chat template:
    a malformed record, or a prompt longer than data.max_prompt_tokens (which would fail when drawn,
    hours into a run), is refused here. Needs transformers: only reached with readable files."""
    from transformers import AutoTokenizer

    from megatron_rl.data.task import ProblemTask

    d, ckpt = cfg.data, cfg.model.hf_checkpoint
    try:
        tok = AutoTokenizer.from_pretrained(ckpt)
    except Exception as e:  # OSError, ValueError, huggingface_hub's validation errors: any is a refusal
        return [Problem("model.hf_checkpoint", ckpt, f"holds no tokenizer transformers can load: {e}")]
    try:
        task = ProblemTask.from_config(cfg, tok)
    except (ValueError, OSError) as e:
        return [Problem("data.source", d.source, f"cannot be read as problems: {e}")]
    cap = cfg.data.max_prompt_tokens
    try:
        sizes = [(len(task.encode_prompt(p.prompt)), p.id) for p in task.problems[:MAX_PROMPTS_CHECKED]]
    except Exception as e:  # the chat template raised (jinja's TemplateError), or refused a system message
        key = "data.system_prompt" if d.system_prompt else "model.hf_checkpoint"
        value = d.system_prompt if d.system_prompt else ckpt
        return [Problem(key, value, f"the tokenizer's chat template fails on the prompts: {e}")]
    long = sorted((n, pid) for n, pid in sizes if n > cap)
    if not long:
        return []
    n, pid = long[-1]
    return [
        Problem(
            "data.max_prompt_tokens",
            cap,
            f"{len(long)} of {len(sizes)} prompts are longer (the longest: problem {pid!r}, {n} tokens with "
            "the chat template); raise it or drop those problems",
        )
    ]


def stop_id_problems(model) -> list[Problem]:
    """The end ids the engines will stop at, read from the checkpoint as the driver reads them: a file
    that does not parse, or an id past the vocabulary, is refused here rather than when engines start."""
    if not model.hf_checkpoint or not (Path(model.hf_checkpoint) / "config.json").is_file():
        return []
    from megatron_rl.models.checkpoint import stop_token_ids

    try:
        ids = stop_token_ids(model.hf_checkpoint)
    except (ValueError, OSError) as e:
        return [
            Problem("model.hf_checkpoint", model.hf_checkpoint, f"its end-of-sequence ids do not read: {e}")
        ]
    past = [i for i in ids if model.vocab_size is not None and i >= model.vocab_size]
    if past:
        return [
            Problem(
                "model.hf_checkpoint",
                model.hf_checkpoint,
                f"names end ids {past} at or past model.vocab_size={model.vocab_size}",
            )
        ]
    return []


def file_problems(cfg: RecipeConfig) -> list[Problem]:
    """Paths the recipe names that cannot be read from this machine."""
    out = []
    ckpt = cfg.model.hf_checkpoint
    if ckpt and not (Path(ckpt) / "config.json").is_file() and cfg.model.num_layers is not None:
        out.append(
            Problem(
                "model.hf_checkpoint",
                ckpt,
                "holds no config.json (an HF model directory is expected)",
                "files",
            )
        )
    resume = cfg.checkpoint.resume
    if resume not in ("auto", "none") and not Path(resume).expanduser().is_dir():
        out.append(
            Problem(
                "checkpoint.resume",
                resume,
                "is neither auto, none nor an existing checkpoint folder (a step folder or a run's folder of them)",
                "files",
            )
        )
    for key in ("logger.run_dir", "checkpoint.dir"):
        if not str(get_key(cfg, key)).strip():  # Path("") is ".": the run would write into whatever cwd is
            out.append(
                Problem(key, get_key(cfg, key), "must name a folder; empty means the current directory")
            )
            continue
        where = Path(get_key(cfg, key)).expanduser()
        blocked = next((p for p in (where, *where.parents) if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            out.append(Problem(key, str(where), f"cannot be a folder: {blocked} is a file", "files"))
    if cfg.reward.kind == "function" and re.fullmatch(r"[\w.]+:\w+", cfg.reward.function):
        import importlib.util

        module = cfg.reward.function.split(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(
                Problem(
                    "reward.function",
                    cfg.reward.function,
                    f"module {module!r} is not importable here",
                    "files",
                )
            )
    source = cfg.data.source
    if source != "synthetic":
        from megatron_rl.data.sources import source_problem

        why = source_problem(source)
        if why:
            out.append(Problem("data.source", source, why, "files"))
    return out
