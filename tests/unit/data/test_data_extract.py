import pytest

from megatron_rl.reward.extract import compose_program, extract_code, fenced_blocks

SOLUTION = "def f(x):\n    return x + 1\n"


@pytest.mark.parametrize(
    ("completion", "entry_point", "expected"),
    [
        (f"Here:\n```python\n{SOLUTION}```\nDone.", None, SOLUTION),
        (f"```py\n{SOLUTION}```", None, SOLUTION),
        (f"```\n{SOLUTION}```", None, SOLUTION),
        # the last block wins without an entry point ...
        (f"```python\n{SOLUTION}```\nUsage:\n```python\nprint(f(1))\n```", None, "print(f(1))\n"),
        # ... but with one, the last block that defines it wins over a trailing example
        (f"```python\n{SOLUTION}```\nUsage:\n```python\nprint(f(1))\n```", "f", SOLUTION),
        # cut off by the token limit inside the block
        ("```python\ndef f(x):\n    return x", "f", "def f(x):\n    return x\n"),
        # reasoning drafts do not count
        (
            "<think>\n```python\ndef f(x): return 0\n```\n</think>\n```python\n" + SOLUTION + "```",
            "f",
            SOLUTION,
        ),
        # plain code
        (SOLUTION, "f", SOLUTION),
        ("Sure! Here it is:\n" + SOLUTION, "f", SOLUTION),
        ("x = 1\nprint(x)\n", None, "x = 1\nprint(x)\n"),
        ("ans = 1+*2", None, "ans = 1+*2\n"),  # looks like code: let the sandbox say syntax_error
        # no code
        ("I cannot solve this.", "f", None),
        ("Sure", None, None),
        ("", None, None),
        ("```cpp\nint f(int x) { return x + 1; }\n```", "f", None),
        ("```python\n\n```", None, None),
    ],
)
def test_extract_code(completion, entry_point, expected):
    assert extract_code(completion, entry_point) == expected


def test_fences_of_four_backticks_and_tildes():
    blocks = fenced_blocks("````python\n```\ninner\n```\n````\n~~~\nx = 1\n~~~\n")
    assert [b.lang for b in blocks] == ["python", ""]
    assert blocks[0].code == "```\ninner\n```\n"
    assert blocks[1].code == "x = 1\n" and all(b.closed for b in blocks)


PROMPT = 'from typing import List\n\n\ndef total(xs: List[int]) -> int:\n    """The sum."""\n'
STARTER = "import math\nclass Solution:\n    def total(self, xs: List[int]) -> int:\n        "


@pytest.mark.parametrize(
    ("completion", "prefix", "expected"),
    [
        # HumanEval's shape: the body that continues the prompt, joined as the harness joins it
        ("    return sum(xs)\n", PROMPT, PROMPT + "    return sum(xs)\n"),
        # a fenced full function, and the entry point alone: after the prompt, whose imports they use
        (
            "Sure:\n```python\ndef total(xs):\n    return sum(xs)\n```",
            PROMPT,
            PROMPT + "\ndef total(xs):\n    return sum(xs)\n",
        ),
        (
            "def total(xs: List[int]) -> int:\n    return sum(xs)\n",
            PROMPT,
            PROMPT + "def total(xs: List[int]) -> int:\n    return sum(xs)\n",
        ),
        # a fenced body
        ("```python\n    return sum(xs)\n```", PROMPT, PROMPT + "\n    return sum(xs)\n"),
        # starter code that stops at an open def: continued on its last line, or restated after its head
        ("return sum(xs)\n", STARTER, STARTER + "return sum(xs)\n"),
        (
            "```python\nclass Solution:\n    def total(self, xs):\n        return sum(xs)\n```",
            STARTER,
            "import math\n\nclass Solution:\n    def total(self, xs):\n        return sum(xs)\n",
        ),
        ("Sure", PROMPT, None),  # prose is still no code
        ("```cpp\nint total();\n```", PROMPT, None),
        ("def f(x):\n    return x\n", "", "def f(x):\n    return x\n"),  # no prefix: extract_code
    ],
)
def test_compose_program_runs_the_problems_code_first(completion, prefix, expected):
    assert compose_program(completion, prefix, "total") == expected
