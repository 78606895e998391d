"""Assertion sites: every place the tests assert, numbered, instrumented, and tied to the units that run it.

Standard library only: it runs on the host when problems load (`testplan`), and the code it rewrites
runs in the sandbox's test runner, where `proof.Recorder` counts what each site did.

A *site* is a check that must run and hold:
- an `assert` statement (but `assert False`: that is a tripwire, below);
- a call of a unittest assertion method, an attribute call named `assert...` (`self.assertEqual(a, b)`,
  `self.assertRaises(E)`);
- a *guard*: an `if` without `else` whose body ends in a tripwire (`if got != want: self.fail()`),
  which is `assert not (got != want)` written the other way round.
A *tripwire* is a statement that fails the test when it runs: `self.fail(...)`, `raise AssertionError`,
`assert False`. It need not run (it runs only when something is wrong); when it runs, the
AssertionError it raises fails the unit even if something catches it (proof rule 2).

Sites are numbered in source order, and each is rewritten so the runner sees it start and hold:

    assert TEST, MSG     ->  assert (__mrl_start__(K) and __mrl_held__(K, TEST)), MSG
    x.assertEqual(a, b)  ->  (__mrl_start__(K) and __mrl_done__(K, x.assertEqual(a, b)))
    if BAD: self.fail()  ->  if (__mrl_start__(K) and __mrl_clear__(K, BAD)): self.fail()

`__mrl_start__` records that site K began and returns True; `__mrl_held__` records that it held when its
test is true and returns the truth; `__mrl_done__` records that the call returned and passes its value
on (an `assertRaises` context manager keeps working); `__mrl_clear__` records that a guard held when
its condition is false and returns the truth. The test expression stays where it was (no lambda), so
its scoping, walrus targets and order of evaluation are Python's. A site that began and did not hold,
whatever then happened to the exception, is a failure the runner has seen.

Which sites a unit must run (`Reach`):
- *lexical*: the sites inside the unit's own code: its statement, the body of the test function or
  method it runs, the body of the tests-defined function its statement calls (`run_checks()`), each
  with everything nested inside. Each of these must start during the unit.
- *attributed*: the sites of what the unit's code reaches by name, transitively: top-level functions
  and classes it references (called or not), and methods reached as attributes (`self.helper`) of the
  classes it reaches, with unittest's hooks (setUp, tearDown, ...) of the case it runs. Each must start
  at least once during the whole run: a helper that asserts, is referenced, and never runs (`assert
  verify`, an unconsumed `map(verify, ...)`) fails the units that reach it.
A site that no unit reaches and no set-up statement calls is dead: the tests are refused at load.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator

START, HELD, DONE, CLEAR = "__mrl_start__", "__mrl_held__", "__mrl_done__", "__mrl_clear__"
_FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
# unittest's hooks: TestSuite.run and TestCase.run call them around every test method.
CASE_HOOKS = (
    "setUp",
    "tearDown",
    "setUpClass",
    "tearDownClass",
    "asyncSetUp",
    "asyncTearDown",
    "doCleanups",
)


def is_site_call(node: ast.AST) -> bool:
    """A call of a unittest-style assertion method: `x.assert...(...)`."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr.startswith("assert")
    )


def is_tripwire(node: ast.AST) -> bool:
    """A statement (or call) that fails the test when it runs: `x.fail(...)`, `raise AssertionError`,
    `assert False` (any constant false test)."""
    if isinstance(node, ast.Expr):
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        return node.func.attr == "fail"
    if isinstance(node, ast.Raise) and node.exc is not None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        return isinstance(exc, ast.Name) and exc.id == "AssertionError"
    return isinstance(node, ast.Assert) and isinstance(node.test, ast.Constant) and not node.test.value


def _is_guard(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and not node.orelse and bool(node.body) and is_tripwire(node.body[-1])


def _running(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Like `preorder`, but not into the bodies of functions and lambdas (a def does not run them)."""
    stack = list(nodes)[::-1]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (*_FUNCS, ast.Lambda)):  # what a def evaluates: decorators and defaults
            decorators = node.decorator_list if isinstance(node, _FUNCS) else []
            stack.extend(reversed([*decorators, *node.args.defaults, *filter(None, node.args.kw_defaults)]))
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def preorder(nodes: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Every node below `nodes` (included), in source order, without recursion (deep tests stay safe)."""
    stack = list(nodes)[::-1]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


class Sites:
    """The tests' assertion sites and tripwires, numbered together in source order.

    `trips` holds the numbers of the tripwires: they are not rewritten and never need to run."""

    def __init__(self, body: list[ast.stmt]) -> None:
        self._ids: dict[int, int] = {}  # id(node) -> number; the tree keeps the nodes alive
        self.lines: list[int] = []
        self.trips: set[int] = set()
        for node in preorder(body):
            trip = is_tripwire(node) and not isinstance(node, ast.Expr)
            if trip or isinstance(node, ast.Assert) or is_site_call(node) or _is_guard(node):
                if trip:
                    self.trips.add(len(self.lines))
                self._ids[id(node)] = len(self.lines)
                self.lines.append(node.lineno)

    def __len__(self) -> int:
        return len(self.lines)

    def under(self, nodes: Iterable[ast.AST], defs: bool = True) -> set[int]:
        """The sites and tripwires inside `nodes` (a statement, a def, ...). `defs=False`: only those that
        run when the statements run, not those in the bodies of functions and lambdas they only define."""
        walk = preorder(nodes) if defs else _running(nodes)
        return {self._ids[id(n)] for n in walk if id(n) in self._ids}

    def instrument(self, tree: ast.AST) -> None:
        """Rewrite every site in place (see the module docstring). Call once, after every `under`."""
        _Instrument({i: k for i, k in self._ids.items() if k not in self.trips}).visit(tree)
        ast.fix_missing_locations(tree)


def _hook(name: str, *args: ast.expr) -> ast.Call:
    return ast.Call(func=ast.Name(id=name, ctx=ast.Load()), args=list(args), keywords=[])


class _Instrument(ast.NodeTransformer):
    def __init__(self, ids: dict[int, int]) -> None:
        self.ids = ids

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        k = self.ids.get(id(node))
        self.generic_visit(node)
        if k is None:  # `assert False`: a tripwire, left as it is
            return node
        test = ast.BoolOp(
            op=ast.And(), values=[_hook(START, ast.Constant(k)), _hook(HELD, ast.Constant(k), node.test)]
        )
        node.test = ast.copy_location(test, node.test)
        return node

    def visit_If(self, node: ast.If) -> ast.If:
        k = self.ids.get(id(node))
        self.generic_visit(node)
        if k is not None:  # a guard: holds when its condition is false
            test = ast.BoolOp(
                op=ast.And(), values=[_hook(START, ast.Constant(k)), _hook(CLEAR, ast.Constant(k), node.test)]
            )
            node.test = ast.copy_location(test, node.test)
        return node

    def visit_Call(self, node: ast.Call) -> ast.expr:
        k = self.ids.get(id(node))
        self.generic_visit(node)
        if k is None:
            return node
        wrapped = ast.BoolOp(
            op=ast.And(), values=[_hook(START, ast.Constant(k)), _hook(DONE, ast.Constant(k), node)]
        )
        return ast.copy_location(wrapped, node)


# ---- reach: what a unit's code can run ------------------------------------------------------------


class Reach:
    """Top-level functions and classes of the tests, and what a piece of their code reaches by name."""

    def __init__(self, body: list[ast.stmt], sites: Sites) -> None:
        self.sites = sites
        self.defs = {s.name: s for s in body if isinstance(s, (*_FUNCS, ast.ClassDef))}
        self.classes = {n: s for n, s in self.defs.items() if isinstance(s, ast.ClassDef)}

    def methods(self, cls: ast.ClassDef, seen: frozenset = frozenset()) -> dict[str, ast.AST]:
        """A class's own methods over those of its tests-defined bases."""
        found: dict[str, ast.AST] = {}
        for base in cls.bases:
            if isinstance(base, ast.Name) and base.id in self.classes and base.id not in seen:
                found.update(self.methods(self.classes[base.id], seen | {base.id}))
        found.update({s.name: s for s in cls.body if isinstance(s, _FUNCS)})
        return found

    def reached(
        self, seeds: list[ast.AST], classes: Iterable[str] = (), calls_only: bool = False
    ) -> set[int]:
        """Sites of every def reachable from `seeds` (not those inside the seeds themselves).

        `classes`: classes already reached (the case a unittest unit runs). `calls_only`: from the seeds
        themselves follow only the names they call when they run (a set-up statement that mentions a
        helper without calling it, or defines a function that would, does not run it); from there on
        every reference counts."""
        visited: set[int] = set()
        reached_classes = set(classes)
        attrs: set[str] = set()
        found: set[int] = set()
        frontier = list(seeds)
        first = calls_only
        while frontier:
            names: set[str] = set()
            for node in _running(frontier) if first else preorder(frontier):
                if first and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    names.add(node.func.id)
                elif not first and isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                    names.add(node.id)
                elif not first and isinstance(node, ast.Attribute):
                    attrs.add(node.attr)
            first = False
            frontier = []
            for name in names:
                node = self.defs.get(name)
                if node is not None and id(node) not in visited:
                    visited.add(id(node))
                    frontier.append(node)
                    if isinstance(node, ast.ClassDef):
                        reached_classes.add(name)
            for cls in reached_classes:
                for name, method in self.methods(self.classes[cls]).items():
                    if (name in attrs or name in CASE_HOOKS) and id(method) not in visited:
                        visited.add(id(method))
                        frontier.append(method)
            for node in frontier:
                if isinstance(node, ast.ClassDef):  # its body runs, its methods are reached by name
                    found |= self.sites.under(node.body, defs=False)
                else:
                    found |= self.sites.under([node])
        return found
