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


def test_a_rank_killed_by_abort_keeps_its_last_stderr_line_in_the_log(tmp_path):
    """abort() skips every handler and atexit: the last lines must not die with the process."""
    body = """
    print("library noise", flush=True)
    os.write(2, b"NCCL watchdog: collective operation timed out after 600000 ms\\n")
    os.abort()
    """
    done = _run(tmp_path, body, rank=2)
    assert done.returncode == -6, (done.returncode, done.stderr)
    log = (tmp_path / "log.txt").read_text().splitlines()
    assert log[-1] == "[rank2] NCCL watchdog: collective operation timed out after 600000 ms", log


def test_a_user_facing_error_is_one_line_from_rank_0_and_the_traceback_stays_in_the_log(tmp_path):
    body = """
    from megatron_rl.checkpoint.integrity import NoSpaceError
    raise NoSpaceError(Path("/ckpt"), needed=3 << 30, free=1 << 30)
    """
    for rank in (0, 1):
        done = _run(tmp_path, body, rank=rank)
        assert done.returncode == 1
        terminal = (done.stdout + done.stderr).strip().splitlines()
        if rank == 0:
            assert len(terminal) == 1 and terminal[0].startswith("error: no space left on device"), terminal
        else:
            assert terminal == [], terminal
    log = (tmp_path / "log.txt").read_text()
    assert "Traceback (most recent call last)" in log and "NoSpaceError" in log
    assert log.splitlines()[-1].startswith(
        "[rank1] error: no space left on device for the checkpoint in /ckpt"
    )


def test_a_config_error_is_one_line(tmp_path):
    body = 'from megatron_rl.check.recipe import ConfigError\nraise ConfigError(["layout.tp=3 ..."])'
    done = _run(tmp_path, body)
    assert done.returncode == 1
    terminal = done.stdout + done.stderr
    assert terminal.startswith("error: invalid recipe:") and "layout.tp=3 ..." in terminal, terminal
    assert "Traceback" not in terminal


def test_a_bug_is_a_traceback_on_rank_0_only(tmp_path):
    body = 'raise KeyError("w")'
    done = _run(tmp_path, body, rank=0)
    assert "[rank0] Traceback (most recent call last)" in done.stderr and "KeyError" in done.stderr
    done = _run(tmp_path, body, rank=5)
    assert done.stderr.strip().splitlines() == ["[rank5] KeyError: 'w' (traceback in log.txt)"], done.stderr
