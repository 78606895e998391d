"""The shipped environments against the real sandbox: the code-feedback environment answers with what
failed and ends on a pass, the tool-calling environment runs Python in the sandbox and says what is wrong
with a malformed call, the expression environment reports value and target; a tool's answer goes through
the HF fixture's chat template as a tool message. Turns are written here (the environment is the unit
under test; the engine-driven turns are in tests/integration/rollout and tests/integration/loop)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from megatron_rl.config.schema import RewardConfig
from megatron_rl.data.synthetic import ArithmeticTask
from megatron_rl.env.code_feedback import CodeFeedback, ExpressionFeedback
from megatron_rl.env.render import ChatRenderer
from megatron_rl.env.tool_calls import ToolCalling
from megatron_rl.env.types import EnvContext, Turn
from megatron_rl.reward.pool import RewardPool
from megatron_rl.reward.problem import Problem
from megatron_rl.reward.sandbox import find_bwrap

pytestmark = pytest.mark.skipif(
    find_bwrap() is None, reason="bubblewrap missing: run sudo tools/setup_system.sh"
)

ADD = Problem(
    id="add", prompt="write add", tests="assert add(1, 2) == 3\nassert add(2, 2) == 4\n", entry_point="add"
)


def _turn(text: str, index: int = 0, last: bool = False) -> Turn:
    return Turn(index=index, ids=(), text=text, last=last)


@pytest.fixture(scope="module")
def pool():
    with RewardPool(RewardConfig(kind="sandbox", workers=2, timeout_s=5.0, mode="fraction")) as p:
        yield p


def test_code_feedback_reports_the_failure_then_ends_on_a_pass(pool):
    ep = CodeFeedback(EnvContext(pool, None, 3)).start(None, ADD)
    wrong = ep.step(_turn("def add(a, b):\n    return a - b\n"))
    assert not wrong.done and wrong.reward == 0.0 and wrong.status == "failed"
    assert "did not pass" in wrong.observation and "assert add(1, 2) == 3" in wrong.observation, (
        wrong.observation
    )
    right = ep.step(_turn("def add(a, b):\n    return a + b\n", index=1))
    assert (right.done, right.reward, right.status) == (True, 1.0, "passed")


def test_code_feedback_grades_the_last_allowed_turn_and_ends(pool):
    ep = CodeFeedback(EnvContext(pool, None, 1)).start(None, ADD)
    r = ep.step(_turn("no code here at all", last=True))
    assert r.done and r.status == "no_code" and r.reward == 0.0


def test_tool_calls_run_python_in_the_sandbox_and_malformed_calls_are_told(pool):
    ep = ToolCalling(EnvContext(pool, None, 4)).start(None, ADD)
    ran = ep.step(_turn('<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>'))
    assert not ran.done and ran.role == "tool" and ran.observation.strip() == "42", ran
    bad = ep.step(_turn("<tool_call>{oops}</tool_call>", index=1))
    assert not bad.done and "not valid JSON" in bad.observation
    unknown = ep.step(_turn('<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}</tool_call>', index=2))
    assert "unknown tool 'shell'" in unknown.observation
    crash = ep.step(_turn('<tool_call>{"name": "python", "arguments": {"code": "1/0"}}</tool_call>', index=2))
    assert "ZeroDivisionError" in crash.observation
    final = ep.step(_turn("def add(a, b):\n    return a + b\n", index=3))
    assert (final.done, final.reward, final.status) == (True, 1.0, "passed")


def test_the_tool_runs_in_the_sandbox_not_on_the_host(pool):
    """The python tool sees none of the host's files: this repository is not there."""
    ep = ToolCalling(EnvContext(pool, None, 4)).start(None, ADD)
    here = Path(__file__).resolve()
    assert here.exists()
    code = f"import os\\nprint('seen' if os.path.exists({str(here)!r}) else 'absent')"
    r = ep.step(_turn('<tool_call>{"name": "python", "arguments": {"code": "' + code + '"}}</tool_call>'))
    assert r.observation.strip() == "absent", r.observation


def test_expression_feedback_says_value_and_target(pool):
    task = ArithmeticTask(seed=0, hidden_target=True)
    prompt = task.draw(1)[0]
    ep = ExpressionFeedback(EnvContext(pool, task, 3)).start(prompt, task.problem(prompt))
    guess = "3*5" if prompt.target != 15 else "2*5"
    r = ep.step(Turn(0, tuple(task.tok.encode(guess)), guess, False))
    value = eval(guess)  # the test's own arithmetic on a literal it wrote
    assert r.observation == f"{value}={prompt.target}=" and not r.done
    hit = str(prompt.target)
    done = ep.step(Turn(1, tuple(task.tok.encode(hit)), hit, False))
    assert (done.done, done.reward, done.status) == (True, 1.0, "passed")


def test_episodes_call_the_pool_from_many_threads_beside_the_stream(pool):
    """call() results go to their callers only, while submit()/results() stream other samples."""
    out = {}

    def one(i):
        ep = CodeFeedback(EnvContext(pool, None, 2)).start(None, ADD)
        out[i] = ep.step(_turn(f"def add(a, b):\n    return a + b + {i % 2}\n"))

    pool.submit("streamed", ADD, "def add(a, b):\n    return a + b\n")
    threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    streamed = list(pool.results())
    assert [r.sample_id for r in streamed] == ["streamed"] and streamed[0].status == "passed"
    assert [out[i].status for i in range(6)] == ["passed", "failed"] * 3


def test_a_tool_answer_goes_through_the_chat_template_as_a_tool_message(pool, hf_fixtures):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_fixtures / "qwen2")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    ep = ToolCalling(EnvContext(pool, None, 4)).start(None, ADD)
    call = '<tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>'
    r = ep.step(_turn(call))
    turn_ids = tok.encode(call, add_special_tokens=False) + [end]
    ids = ChatRenderer(tok, [end]).render(r.observation, r.role, turn_ids)
    text = tok.decode(ids, skip_special_tokens=False)
    assert (
        text.startswith("\n<|im_start|>tool\n")
        and "1024" in text
        and text.endswith("<|im_start|>assistant\n")
    ), text
