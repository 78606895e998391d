"""The commands the READMEs tell a user to type exist, with the flags they show.

A walkthrough that names a command or a flag the tree does not have fails at the first step a new user
takes; this reads every `megatron-rl ...` the READMEs write (inline code and bash blocks) and asks the
command line itself (`COMMAND --help`)."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from megatron_rl.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "slurm/README.md")


def _commands() -> list[str]:
    """Every `megatron-rl ...` command line the READMEs write, as written."""
    out = []
    for name in DOCS:
        text = (REPO / name).read_text()
        out += re.findall(r"`(megatron-rl [a-z][^`]*)`", text)
        for block in re.findall(r"```bash\n(.*?)```", text, re.S):
            out += [line.split("#")[0].strip() for line in block.splitlines()]
    return [c for c in out if c.startswith("megatron-rl ")]


def _help(argv: list[str]) -> str:
    """What `megatron-rl ARGV --help` prints (argparse exits; `run` prints its docstring)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        try:
            main([*argv, "--help"])
        except SystemExit:
            pass
    return buf.getvalue()


def test_the_readmes_name_commands():
    assert len(_commands()) > 20  # the pattern still finds them


@pytest.mark.parametrize("line", sorted(set(_commands())))
def test_a_command_the_readmes_write_exists_with_its_flags(line):
    words = line.split()
    assert words[1] in COMMANDS, f"{line!r}: no command {words[1]!r} (megatron_rl/cli/__init__.py)"
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", " ".join(words[2:])))
    if not flags:
        return
    text = _help([words[1]])
    if len(words) > 2 and re.fullmatch(r"[a-z]+", words[2]):  # a subcommand: `ckpt verify`
        text += _help(words[1:3])
    missing = sorted(f for f in flags if not re.search(rf"{re.escape(f)}(?![\w-])", text))
    assert not missing, f"{line!r}: `megatron-rl {words[1]} --help` shows no {missing}"
