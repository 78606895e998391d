"""No input to any CLI command ends in a traceback: random and adversarial overrides and recipe files.

Every command is run in-process through `megatron_rl.cli.main`; each case must return an exit code
(argparse's SystemExit counts) and print no traceback, within a time bound (a YAML alias bomb must be
refused in a second, not expanded for minutes).
"""

from __future__ import annotations

import contextlib
import io
import random
import time
import traceback

import pytest

from megatron_rl.check.ranges import NUMERIC
from megatron_rl.cli import main

VALUES = [
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "-0",
    "1e309",
    "99999999999999999999",
    "abc",
    "[1,2]",
    "{}",
    "null",
    "''",
    "true",
    "???",
    "${oc.env:MEGATRON_RL_NO_SUCH_VAR}",
    "${steps}",
    "${nope}",
    "1.5",
    "[]",
    "[-1]",
    "'\\x00'",
    "[[1]]",
    "{a: 1}",
]
KEYS = sorted(NUMERIC) + [
    "name",
    "model.family",
    "layout.placement",
    "rollout.logprobs_mode",
    "reward.kind",
    "reward.function",
    "data.source",
    "model.hf_checkpoint",
    "checkpoint.resume",
    "cluster.time_limit",
    "logger.run_dir",
    "rollout.temperature",
    "rollout.top_p",
    "rollout.top_k",
    "layout.pp_layers",
    "model.head_dim",
]
MALFORMED = [
    "=",
    "a",
    "==",
    "=3",
    "+x=1",
    "~layout",
    "layout=",
    "model=nosuch",
    "++steps=3",
    "steps",
    "steps==3",
    "hydra.run.dir=x",
    "layout.tp.x=1",
    "+layout.tpp=2",
    "model.name=",
    "steps=1=2",
    "defaults=[]",
]
VALID_HYDRA = {"++steps=3", "hydra.run.dir=x"}  # Hydra's force-add, and its own settings: accepted
COMMANDS = [
    ["validate"],
    ["show"],
    ["plan", "--no-search"],
    ["plan", "--json", "--no-search"],
    ["reshard-plan"],
    ["submit", "--dry-run"],
]


def run_cli(argv: list[str], limit_s: float = 30.0) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(argv)
    except SystemExit as e:  # argparse's usage errors
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:
        pytest.fail(f"megatron-rl {argv} raised:\n{traceback.format_exc()}")
    took = time.perf_counter() - start
    text = out.getvalue() + err.getvalue()
    assert "Traceback" not in text, f"megatron-rl {argv} printed a traceback:\n{text}"
    assert took < limit_s, f"megatron-rl {argv} took {took:.1f} s"
    return rc, err.getvalue()


def _cases(seed: int, n: int) -> list[list[str]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        overrides = [f"{rng.choice(KEYS)}={rng.choice(VALUES)}" for _ in range(rng.randint(1, 3))]
        if rng.random() < 0.3:
            overrides.append(rng.choice(MALFORMED))
        cases.append(rng.choice(COMMANDS) + ["grpo_tiny_cpu", *overrides])
    return cases


@pytest.mark.parametrize("argv", _cases(seed=16, n=60), ids=lambda a: " ".join(a)[:80])
def test_random_overrides_get_an_exit_code_not_a_traceback(argv):
    rc, err = run_cli(argv)
    if rc != 0:
        assert err.strip(), f"megatron-rl {argv} failed with exit {rc} and said nothing"


@pytest.mark.parametrize("bad", MALFORMED)
@pytest.mark.parametrize("cmd", [["validate"], ["plan", "--no-search"]])
def test_malformed_overrides(cmd, bad):
    rc, err = run_cli([*cmd, "grpo_tiny_cpu", bad])
    assert rc != 0 or bad in VALID_HYDRA, err


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcdefgh", "bcdefghi")
)
FILES = {
    "empty.yaml": "",
    "comment_only.yaml": "# nothing here\n",
    "list.yaml": "- 1\n- 2\n",
    "scalar.yaml": "42\n",
    "invalid.yaml": "name: [unclosed\n",
    "tabs.yaml": "name:\tx\n\tsteps: 3\n",
    "no_defaults.yaml": "name: x\nsteps: 3\n",
    "no_name.yaml": "defaults:\n  - /base\n  - _self_\n",
    "unknown_key.yaml": "defaults:\n  - /base\n  - _self_\nname: x\nbogus: 1\n",
    "bad_group.yaml": "defaults:\n  - /base\n  - override /model: nosuch\n  - _self_\nname: x\n",
    "bomb.yaml": "defaults:\n  - /base\n  - _self_\nname: x\n" + BOMB,
    "binary.yaml": "\x00\x01\x02name: x\n",
    "deep.yaml": "name: x\n" + "a:\n" + "".join("  " * i + f"b{i}:\n" for i in range(1, 200)),
    "huge.yaml": "# " + "x" * (1 << 21) + "\n",
    "wrong_type.yaml": "defaults:\n  - /base\n  - _self_\nname: x\nsteps: many\n",
    "interp.yaml": "defaults:\n  - /base\n  - _self_\nname: x\nsteps: ${nope}\n",
    "nested_list.yaml": "name: x\nfoo: " + "[" * 20000 + "]" * 20000 + "\n",
    "nested_map.yaml": "name: x\nfoo: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n",
    "recursive_alias.yaml": "defaults:\n  - /base\n  - _self_\nname: x\nfoo: &a [1, *a]\n",
    "dots.yaml": "defaults:\n  - /base\n  - _self_\nname: ..\n",
}


@pytest.mark.parametrize("fname", sorted(FILES))
@pytest.mark.parametrize("cmd", [["validate"], ["show"], ["plan", "--no-search"], ["submit", "--dry-run"]])
def test_adversarial_recipe_files(tmp_path, cmd, fname):
    path = tmp_path / fname
    path.write_text(FILES[fname])
    rc, err = run_cli([*cmd, str(path)], limit_s=10.0)
    if cmd == ["show"] and fname == "dots.yaml":
        return  # show prints any recipe that composes; the check refuses its name
    assert rc != 0 and err.strip(), f"{fname}: exit {rc}"


def test_bomb_and_size_are_refused_with_the_reason(tmp_path):
    (tmp_path / "bomb.yaml").write_text(FILES["bomb.yaml"])
    rc, err = run_cli(["validate", str(tmp_path / "bomb.yaml")], limit_s=5.0)
    assert rc == 2 and "aliases" in err
    (tmp_path / "huge.yaml").write_text(FILES["huge.yaml"])
    rc, err = run_cli(["validate", str(tmp_path / "huge.yaml")], limit_s=5.0)
    assert rc == 2 and "at most" in err


def test_a_bomb_beside_the_recipe_is_refused(tmp_path):
    """A defaults entry may pull in any YAML of the recipe's folder: those are bounded too."""
    (tmp_path / "other.yaml").write_text(BOMB)
    (tmp_path / "main.yaml").write_text("defaults:\n  - /base\n  - other\n  - _self_\nname: x\n")
    rc, err = run_cli(["validate", str(tmp_path / "main.yaml")], limit_s=10.0)
    assert rc == 2 and "aliases" in err


def test_long_names_and_huge_numbers(tmp_path):
    for argv in (
        ["plan", "a" * 300 + ".yaml", "--no-search"],
        ["reshard-plan", "a" * 300 + ".yaml"],
        ["cp", "a" * 300, str(tmp_path)],
        ["validate", "grpo_tiny_cpu", "model.vocab_size=1" + "0" * 330],
        ["plan", "grpo_tiny_cpu", "--no-search", "model.hidden_size=1" + "0" * 30],
        ["plan", "grpo_tiny_cpu", "--no-search", "--plot", str(tmp_path)],
    ):
        rc, err = run_cli(argv)
        assert rc != 0 and err.strip(), f"{argv[:3]}: exit {rc}"


def test_paths_that_are_not_recipe_files(tmp_path):
    for argv in (
        ["validate", str(tmp_path)],
        ["validate", str(tmp_path / "missing.yaml")],
        ["cp", "grpo_tiny_cpu", str(tmp_path / "x.yaml")]
        if (tmp_path / "x.yaml").write_text("") is not None
        else [],
        ["cp", "no_such_recipe", str(tmp_path)],
        ["report", str(tmp_path / "nope")],
        ["ckpt", "verify", str(tmp_path / "nope")],
        ["plan"],
        ["plan", "--from-steps", str(tmp_path / "none.jsonl")],
        ["reshard-plan", "no_such_recipe"],
        ["nosuchcommand"],
    ):
        rc, err = run_cli(argv)
        assert rc != 0 and err.strip(), f"{argv}: exit {rc}"
