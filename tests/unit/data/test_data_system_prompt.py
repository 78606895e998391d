"""`data.system_prompt`: a system message under a chat template, plain text before the prompt without
one. The tokenizer is a real (tiny, word-level) HF fast tokenizer built here."""

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from megatron_rl.data.task import ProblemTask
from megatron_rl.reward.problem import Problem

WORDS = ["[UNK]", "<s>", "system", "user", "assistant", "be", "brief", "add", "two", "numbers", ":", "\n"]
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
NO_SYSTEM = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}{{ m['content'] }}{% endfor %}"


def _tokenizer(template: str | None) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r"<s>|:|\n"), behavior="isolated"), pre_tokenizers.WhitespaceSplit()]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = template
    return fast


def _ids(template: str | None, system: str) -> list[int]:
    task = ProblemTask(
        [Problem("p", "add two numbers", "assert 1")], _tokenizer(template), system_prompt=system
    )
    return task.draw(1)[0].prompt_ids


def _words(ids: list[int]) -> str:
    return "".join(WORDS[i] for i in ids if WORDS[i].strip())


def test_system_message_under_a_chat_template():
    assert _words(_ids(TEMPLATE, "")) == "<s>user:addtwonumbers<s>assistant:"
    assert _words(_ids(TEMPLATE, "be brief")) == "<s>system:bebrief<s>user:addtwonumbers<s>assistant:"


def test_plain_text_before_the_prompt_without_a_template():
    assert _words(_ids(None, "")) == "addtwonumbers"
    assert _words(_ids(None, "be brief")) == "bebriefaddtwonumbers"


def test_a_template_that_refuses_system_messages_names_the_setting():
    assert _words(_ids(NO_SYSTEM, "")) == "addtwonumbers"
    with pytest.raises(ValueError, match="unset data.system_prompt"):
        _ids(NO_SYSTEM, "be brief")


def test_a_saved_state_does_not_move_when_the_task_draws_on():
    """Checkpoints keep a state from before batches drawn ahead (asynchronous runs): it must be a copy,
    and loading it must give back the prompts drawn after it was taken."""
    problems = [Problem(str(i), "add two numbers", "assert 1") for i in range(5)]
    task = ProblemTask(problems, _tokenizer(None), seed=0)
    saved = task.state()
    before = list(saved["order"])
    first = [p.problem.id for p in task.draw(3)]
    assert saved["order"] == before, "the saved order moved with the live task"
    again = ProblemTask(problems, _tokenizer(None), seed=0)
    again.draw(1)  # elsewhere in the stream: loading must put it back
    again.load_state(saved)
    assert [p.problem.id for p in again.draw(3)] == first
