"""The console: third-party output into log.txt with the rank, errors still on the terminal.

Each case runs a small script in its own interpreter (the console redirects the process's own fds).
"""

import subprocess
import sys
import textwrap

from tests.helpers.launch import REPO


def _run(tmp_path, body: str, rank: int = 0, verbose: bool = False):
    script = tmp_path / "rank.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import logging, os, sys, warnings
            from pathlib import Path
            from megatron_rl.telemetry import console

            def main():
                c = console.start(Path({str(tmp_path / "log.txt")!r}), {rank}, verbose={verbose})
                logging.basicConfig(level=logging.INFO)  # as the run does: every record to stderr
            """
        )
        + textwrap.indent(textwrap.dedent(body), "    ")
        + "\nsys.exit(console.run_guarded(main))\n"
    )
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO, timeout=60)


CHATTER = """
print("config dump from a library")
os.write(2, b"raw C-level stderr line\\n")
warnings.warn("Apex is not installed")
os.system("echo from a child process")
c.say("header line")
logging.getLogger("megatron_rl.x").warning("our own warning")
logging.getLogger("vllm").warning("their warning")
return 0
"""


def test_chatter_goes_to_the_log_with_the_rank_and_the_terminal_keeps_ours(tmp_path):
    done = _run(tmp_path, CHATTER)
    assert done.returncode == 0, done.stderr
    terminal = done.stdout + done.stderr
    assert terminal.splitlines() == ["header line", "warning: our own warning"], terminal
    log = (tmp_path / "log.txt").read_text().splitlines()
    for text in (
        "config dump from a library",
        "raw C-level stderr line",
        "from a child process",
        "header line",
    ):
        assert f"[rank0] {text}" in log, (text, log)
    assert any(line.startswith("[rank0] ") and "Apex is not installed" in line for line in log)


def test_other_ranks_keep_warnings_in_the_log(tmp_path):
    done = _run(tmp_path, CHATTER.replace('c.say("header line")\n', ""), rank=1)
    assert (done.stdout + done.stderr).strip() == "", done.stderr
    assert "[rank1] config dump from a library" in (tmp_path / "log.txt").read_text()


def test_an_uncaught_error_reaches_the_terminal_and_the_log(tmp_path):
    done = _run(tmp_path, 'print("noise")\nraise RuntimeError("the engine dropped 3 requests")', rank=1)
    assert done.returncode == 1
    assert "[rank1] RuntimeError: the engine dropped 3 requests" in done.stderr, done.stderr
    assert "noise" not in done.stdout + done.stderr
    assert "RuntimeError: the engine dropped 3 requests" in (tmp_path / "log.txt").read_text()


def test_a_system_exit_message_reaches_the_terminal(tmp_path):
    done = _run(tmp_path, 'raise SystemExit("set layout.placement=colocated")')
    assert done.returncode == 1
    assert "set layout.placement=colocated" in done.stderr


def test_our_logged_errors_reach_the_terminal_from_any_rank(tmp_path):
    done = _run(tmp_path, 'logging.getLogger("megatron_rl.reward").error("sandbox died")\nreturn 0', rank=3)
    assert "[rank3] error: sandbox died" in done.stderr, done.stderr


def test_verbose_copies_everything_to_the_terminal(tmp_path):
    done = _run(tmp_path, CHATTER, verbose=True)
    terminal = done.stdout + done.stderr
    for text in ("config dump from a library", "raw C-level stderr line", "Apex is not installed"):
        assert text in terminal, terminal
    assert terminal.count("our own warning") == 1, "verbose must not print our warnings twice"
