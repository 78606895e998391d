"""Pull the program out of a model's completion.

Completions wrap code in prose, fence it in markdown (often more than once: a solution, then an
example), reason inside <think> tags first, or get cut off by the token limit mid-block. The rules,
in order:
1. Only what follows the last `</think>` counts: drafts inside the reasoning are not the answer.
2. Fenced blocks tagged python/py (or untagged) are candidates; an unterminated final block (the
   completion hit max_new_tokens) still counts. With an entry point, the last block that defines it
   wins (a trailing usage example does not); otherwise the last block.
3. No fences at all: the text itself if it parses as a Python program (more than a bare word), else
   the text from the first line that starts like code (def, class, import, from, @, `name =`); else
   nothing.
Fences in other languages only (```cpp) mean no Python code: the answer is `None` (status no_code).

When the problem has code of its own that runs before the completion (`Problem.prefix`: HumanEval's
prompt, APPS's starter code), the program is composed as the published harnesses compose it, so that
the three shapes a model answers in all run (`compose_program`):
a. the bare continuation (no fences; an indented body, or text that completes the prefix's last line):
   prefix + completion, character for character (HumanEval's `prompt + completion`);
b. otherwise the extracted code (a fenced full function, the entry point alone, a fenced body) after
   the prefix: prefix + newline + code, when that parses (the prefix's imports and helpers are there
   for the code, which may redefine them);
c. when the prefix does not parse on its own (starter code stopping at an open `def`) and (b) does not
   parse: the longest head of the prefix that parses (the imports before the starter), then the code,
   which restates the starter.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

PYTHON_TAGS = {"", "python", "py", "python3", "py3"}
_CODE_START = re.compile(r"^(?:async\s+def|def|class|import|from)\s|^@|^[A-Za-z_]\w*\s*=[^=]", re.M)
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([^\s`]*)")


@dataclass
class Block:
    lang: str
    code: str
    closed: bool


def fenced_blocks(text: str) -> list[Block]:
    """Markdown fenced blocks in order; the last one may be unterminated."""
    blocks: list[Block] = []
    fence, lang, lines = None, "", []
    for line in text.splitlines():
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence, lang, lines = m.group(1), m.group(2).lower(), []
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not m.group(2):
            blocks.append(Block(lang, "\n".join(lines) + "\n", True))
            fence = None
        else:
            lines.append(line)
    if fence is not None:
        blocks.append(Block(lang, "\n".join(lines) + "\n", False))
    return blocks


def _defines(code: str, name: str) -> bool:
    return (
        re.search(rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b|^{re.escape(name)}\s*=", code, re.M)
        is not None
    )


def _is_program(text: str) -> bool:
    """Parses as Python and is more than a bare word or literal (prose like "Sure" parses too)."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return any(
        not (isinstance(s, ast.Expr) and isinstance(s.value, (ast.Name, ast.Constant))) for s in tree.body
    )


def extract_code(completion: str, entry_point: str | None = None) -> str | None:
    """The Python program in `completion`, or None when there is none."""
    text = completion.rsplit("</think>", 1)[-1]
    blocks = fenced_blocks(text)
    if blocks:
        python = [b for b in blocks if b.lang in PYTHON_TAGS and b.code.strip()]
        if not python:
            return None
        if entry_point:
            defining = [b for b in python if _defines(b.code, entry_point)]
            if defining:
                return defining[-1].code
        return python[-1].code
    stripped = text.strip("\n")
    if not stripped.strip():
        return None
    if _is_program(stripped):
        return stripped + "\n"
    m = _CODE_START.search(stripped)
    return stripped[m.start() :] + "\n" if m else None


def _parses(source: str) -> bool:
    try:
        ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def compose_program(completion: str, prefix: str = "", entry_point: str | None = None) -> str | None:
    """The program to run for `completion` when the problem's code `prefix` comes first (module
    docstring, rules a-c); None when there is no code. Without a prefix: `extract_code`."""
    if not prefix.strip():
        return extract_code(completion, entry_point)
    text = completion.rsplit("</think>", 1)[-1]
    if text.strip() and not fenced_blocks(text):
        first = next((line for line in text.splitlines() if line.strip()), "")
        continues = not prefix.endswith("\n") or first[:1] in (" ", "\t") or _is_program(text.strip("\n"))
        if continues and _parses(prefix + text):
            return prefix + text if prefix.endswith("\n") or text.endswith("\n") else prefix + text + "\n"
    code = extract_code(completion, entry_point)
    if code is None:
        return None
    joined = prefix + "\n" + code
    if _parses(joined) or _parses(prefix):
        return joined
    head = _parsing_head(prefix)
    return f"{head}\n{code}" if head.strip() else code


def _parsing_head(source: str) -> str:
    """The longest run of leading lines of `source` that parses (at most 200 lines are tried)."""
    lines = source.splitlines(keepends=True)
    for cut in range(len(lines) - 1, max(-1, len(lines) - 201), -1):
        head = "".join(lines[:cut])
        if _parses(head):
            return head
    return ""
