"""Small problem sets in the shapes public sets ship in (HumanEval, MBPP, APPS, TACO), and writers for
every file format `data.source` reads. The problems are our own; only the row shapes are the sets'.

Each family comes with completions for the differential test (tests/integration/reward): per problem,
its canonical solution in the shapes a model answers in, and wrong completions, some of them hacks
that a grader binding names from the solution, or running the completion without the prompt, would
misjudge.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

HUMANEVAL = [
    {
        "task_id": "HumanEval/0",
        "prompt": 'from typing import List\n\n\ndef running_max(xs: List[int]) -> List[int]:\n    """ The running maximum of a list.\n    >>> running_max([1, 3, 2])\n    [1, 3, 3]\n    """\n',
        "canonical_solution": "    out = []\n    for x in xs:\n        out.append(x if not out else max(out[-1], x))\n    return out\n",
        "test": "\n\nMETADATA = {'author': 'megatron-rl', 'dataset': 'test'}\n\n\ndef check(candidate):\n    assert candidate([]) == []\n    assert candidate([1, 3, 2]) == [1, 3, 3]\n    assert candidate([5, 4, 7, 1]) == [5, 5, 7, 7]\n",
        "entry_point": "running_max",
    },
    {
        # Like HumanEval/38 and /50: the tests read a helper that only the prompt defines.
        "task_id": "HumanEval/1",
        "prompt": 'def encode_shift(s: str) -> str:\n    """ Shift every letter by one. """\n    return "".join(chr(ord(c) + 1) for c in s)\n\n\ndef decode_shift(s: str) -> str:\n    """ Take a string encoded with encode_shift and return the original. """\n',
        "canonical_solution": '    return "".join(chr(ord(c) - 1) for c in s)\n',
        "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    for s in ['abc', 'hello', '']:\n        assert candidate(encode_shift(s)) == s\n",
        "entry_point": "decode_shift",
    },
    {
        # Like HumanEval/32: random cases, and a prompt that imports what the tests use.
        "task_id": "HumanEval/2",
        "prompt": 'import math\n\n\ndef hypot(a: float, b: float) -> float:\n    """ The length of the hypotenuse.\n    >>> hypot(3, 4)\n    5.0\n    """\n',
        "canonical_solution": "    return math.sqrt(a * a + b * b)\n",
        "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n    import random\n    rng = random.Random(42)\n    for _ in range(20):\n        a, b = rng.randint(0, 50), rng.randint(0, 50)\n        assert abs(candidate(a, b) - math.hypot(a, b)) < 1e-9\n",
        "entry_point": "hypot",
    },
]

MBPP = [
    {
        "text": "Write a function to count the vowels in a string.",
        "code": "def count_vowels(s):\r\n  return sum(c in 'aeiou' for c in s.lower())",
        "task_id": 601,
        "test_setup_code": "",
        "test_list": [
            "assert count_vowels('hello') == 2",
            "assert count_vowels('SKY') == 0",
            "assert count_vowels('Aeiou') == 5",
        ],
        "challenge_test_list": ["assert count_vowels('') == 0"],
    },
    {
        "text": "Write a function to find the area of a circle of radius r.",
        "code": "import math\r\ndef circle_area(r):\r\n\treturn math.pi * r * r",
        "task_id": 602,
        "test_setup_code": "import math",
        "test_list": [
            "assert math.isclose(circle_area(1), math.pi)",
            "assert math.isclose(circle_area(2), 4 * math.pi)",
            "assert circle_area(0) == 0",
        ],
        "challenge_test_list": [],
    },
]
# Shapes the full MBPP holds: a class the tests construct (601's Pair), a tree built by attribute
# assignment in test_setup_code (367's Node), an entry point named like a built-in (126's sum), an
# re.Match tested for truth (737), and a type passed as an argument (533).
MBPP_SHAPES = [
    {
        "text": "Write a function to find the total length of a list of segments.",
        "code": "class Segment(object): \r\n\tdef __init__(self, a, b): \r\n\t\tself.a = a \r\n\t\tself.b = b \r\n"
        "def total_length(segs): \r\n\treturn sum(s.b - s.a for s in segs)",
        "task_id": 604,
        "test_setup_code": "",
        "test_list": [
            "assert total_length([Segment(0, 2), Segment(5, 6)]) == 3",
            "assert total_length([]) == 0",
        ],
        "challenge_test_list": [],
    },
    {
        "text": "Write a function to count the leaves of a binary tree.",
        "code": "class Node: \r\n\tdef __init__(self, data): \r\n\t\tself.data = data \r\n\t\tself.left = None\r\n"
        "\t\tself.right = None\r\ndef count_leaves(root): \r\n\tif root is None: \r\n\t\treturn 0\r\n"
        "\tif root.left is None and root.right is None: \r\n\t\treturn 1\r\n"
        "\treturn count_leaves(root.left) + count_leaves(root.right)",
        "task_id": 605,
        "test_setup_code": "root = Node(1) \nroot.left = Node(2) \nroot.right = Node(3) \nroot.left.left = Node(4) \n"
        "root1 = Node(7)",
        "test_list": ["assert count_leaves(root) == 2", "assert count_leaves(root1) == 1"],
        "challenge_test_list": [],
    },
    {
        "text": "Write a function to add two numbers.",
        "code": "def sum(a, b):\r\n  return a + b",
        "task_id": 606,
        "test_setup_code": "",
        "test_list": ["assert sum(10, 15) == 25", "assert sum(-1, 1) == 0"],
        "challenge_test_list": [],
    },
    {
        "text": "Write a function that matches a string that has an a followed by one or more b's.",
        "code": "import re\r\ndef text_match(text):\r\n  return re.search('ab+', text)",
        "task_id": 607,
        "test_setup_code": "",
        "test_list": ["assert text_match('xabbb')", "assert not text_match('ac')"],
        "challenge_test_list": [],
    },
    {
        "text": "Write a function to remove the elements of a given type from a tuple.",
        "code": "def drop_type(items, kind):\r\n  return [x for x in items if not isinstance(x, kind)]",
        "task_id": 608,
        "test_setup_code": "",
        "test_list": [
            "assert drop_type((1, 2.5, 'a'), str) == [1, 2.5]",
            "assert drop_type((1, 2.5), float) == [1]",
        ],
        "challenge_test_list": [],
    },
]
MBPP_SANITIZED = [
    {
        "source_file": "megatron-rl fixture",
        "task_id": 603,
        "prompt": "Write a function to return the second smallest distinct number of a list.",
        "code": "def second_smallest(xs):\n    return sorted(set(xs))[1]\n",
        "test_imports": [],
        "test_list": ["assert second_smallest([4, 1, 3, 1]) == 3", "assert second_smallest([2, 9]) == 9"],
    }
]

APPS = [
    {
        "problem_id": 4001,
        "question": "Read two integers on one line and print their sum.",
        "solutions": json.dumps(["a, b = map(int, input().split())\nprint(a + b)\n"]),
        "input_output": json.dumps({"inputs": ["1 2\n", "10 -3\n"], "outputs": ["3\n", "7\n"]}),
        "difficulty": "introductory",
        "url": "https://example.invalid/4001",
        "starter_code": "",
    },
    {
        "problem_id": 4002,
        "question": "Write add_all(xs): the sum of a list of integers.",
        "solutions": json.dumps(["def add_all(xs):\n    return sum(xs)\n"]),
        "input_output": json.dumps(
            {"fn_name": "add_all", "inputs": [[[1, 2, 3]], [[]], [[-5, 5, 9]]], "outputs": [[6], [0], [9]]}
        ),
        "difficulty": "introductory",
        "url": "https://example.invalid/4002",
        "starter_code": "def add_all(xs):\n\t",
    },
]
TACO = [
    {
        "question": "Given a list of integers, return the largest product of two of them.",
        "solutions": json.dumps(
            [
                "class Solution:\n    def maxProduct(self, nums: List[int]) -> int:\n        nums = sorted(nums)\n"
                "        return max(nums[0] * nums[1], nums[-1] * nums[-2])\n"
            ]
        ),
        "starter_code": "class Solution:\n    def maxProduct(self, nums: List[int]) -> int:\n        ",
        "input_output": json.dumps(
            {"fn_name": "maxProduct", "inputs": [[[3, 4, 5, 2]], [[-10, -3, 1, 2]]], "outputs": [20, 30]}
        ),
        "difficulty": "EASY",
        "raw_tags": "['Array']",
        "name": None,
        "source": "leetcode",
        "tags": "['Sorting']",
        "skill_types": "['Sorting']",
        "url": "https://example.invalid/max-product",
        "Expected Auxiliary Space": None,
        "time_limit": None,
        "date": None,
        "picture_num": None,
        "memory_limit": None,
        "Expected Time Complexity": None,
    }
]


# ---- completions, per problem id: the canonical one in each shape, and wrong ones -------------------


def humaneval_shapes(row: dict) -> dict[str, str]:
    """The canonical solution as a bare continuation, a fenced full function, and the entry point alone."""
    full = row["prompt"] + row["canonical_solution"]
    body = row["canonical_solution"]
    alone = f"def {row['entry_point']}{_signature(row)}:\n{body}"
    return {
        "continuation": body,
        "fenced_full_function": f"Here is the function:\n```python\n{full}```\n",
        "entry_point_alone": alone,
    }


def _signature(row: dict) -> str:
    head = row["prompt"].split(f"def {row['entry_point']}", 1)[1]
    return head.split(":\n", 1)[0]


HUMANEVAL_WRONG = {
    "HumanEval/0": [
        "    return xs\n",
        "    return sorted(xs)\n",
        "    out = []\n    for x in xs:\n        out.append(x)\n    return out[:1]\n",
    ],
    "HumanEval/1": [
        "    return s\n",
        # redefines the prompt's helper so that decoding is the identity: HumanEval's harness, which runs
        # prompt + completion + tests in one namespace, passes it; the tests here read the prompt's helper
        "    return s\n\n\ndef encode_shift(s):\n    return s\n",
    ],
    "HumanEval/2": [
        "    return a + b\n",
        "    return math.sqrt(a * a + b * b) + 1e-3\n",
        # replaces the prompt's `math` for the tests in HumanEval's shared namespace
        "    return 0.0\n\n\nclass math:\n    @staticmethod\n    def hypot(a, b):\n        return 0.0\n",
    ],
}
MBPP_WRONG = {
    "601": [
        "def count_vowels(s):\n    return len(s)\n",
        "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n",
    ],
    "602": [
        "def circle_area(r):\n    return 3.14 * r * r\n",
        "import math\ndef circle_area(r):\n    return math.pi * r\n",
    ],
    "603": ["def second_smallest(xs):\n    return sorted(xs)[1]\n"],
    "604": [
        "class Segment:\n    def __init__(self, a, b):\n        self.a, self.b = a, b\ndef total_length(segs):\n    return len(segs)\n"
    ],
    "605": [
        "class Node:\n    def __init__(self, data):\n        self.data = data\n        self.left = self.right = None\n"
        "def count_leaves(root):\n    return 1\n",
    ],
    "606": ["def sum(a, b):\n    return a * b\n"],
    "607": ["import re\ndef text_match(text):\n    return re.search('a', text)\n"],
    "608": ["def drop_type(items, kind):\n    return list(items)\n"],
}
APPS_WRONG = {
    "4001": ["a, b = map(int, input().split())\nprint(a - b)\n", "print(3)\n"],
    "4002": [
        "def add_all(xs):\n    return len(xs)\n",
        "def add_all(xs):\n    return [sum(xs)]\n",
        "return max(xs, default=0)\n",
    ],
}
TACO_WRONG = [
    "class Solution:\n    def maxProduct(self, nums):\n        nums = sorted(nums)\n        return nums[-1] * nums[-2]\n",
    "nums = sorted(nums)\n        return nums[0] * nums[1]\n",
]


# ---- writers: one family's rows in each format data.source reads ----------------------------------


def write_jsonl(rows: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_jsonl_gz(rows: list[dict], path: Path) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def write_json(rows: list[dict], path: Path) -> Path:
    path.write_text(json.dumps(rows))
    return path


def write_parquet(rows: list[dict], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_saved_dataset(rows: list[dict], path: Path) -> Path:
    import datasets

    datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return path


WRITERS = {
    "jsonl": (write_jsonl, ".jsonl"),
    "jsonl.gz": (write_jsonl_gz, ".jsonl.gz"),
    "json": (write_json, ".json"),
    "parquet": (write_parquet, ".parquet"),
    "save_to_disk": (write_saved_dataset, ""),
}
