"""Publishing a version of the policy: plan (cached) -> transfer -> stage -> validate -> activate.

Every rank of the job calls `Publisher.publish(policy.named_parameters_global(), step)` at the same
point of the loop (trainer-only ranks of a separated job pass their shards, engine-only ranks an
empty iterable). Version N keeps serving until N+1 has arrived on *every* engine rank and passed
validation there; then all engine ranks activate N+1, or, if any rank found a problem, all discard
it and N stays active (a TP engine with half its ranks on N+1 would serve garbage).

The sink contract (`EngineSink`), for whoever connects an engine:
- `stage(version, tensors)`: take ownership of freshly allocated tensors (the publisher never
  touches them again). The engine must not see them: nothing it serves may change.
- `staged(version)`: the tensors validation reads -- the sink's own copies if it made any, so
  that what is validated is exactly what will activate.
- `activate(version)`: make the staged version the one served, atomically from the engine's
  point of view (for a live vLLM engine: `reload_weights` with the staged tensors in fused groups,
  `rollout.weights.group_fused`, then `reset_prefix_cache()`; or, in-place delivery on GPU, a copy
  into the engine's parameters); then drop the previous version and the staged copy.
- `discard(version)`: drop a rejected staged version; the active one is untouched.
- `active_version`: the version served, None before the first activation.
- optional `holds_weights`: False when the engine no longer holds the active version's weights (a
  level-2 sleep discarded them), so a refused publication leaves nothing to serve (`Publisher.serving`).
- optional `take_retired() -> dict`: tensors of a version the engine no longer serves (replaced or
  rejected), handed back for the publisher to stage the next version into. On CPU this saves
  faulting in fresh pages for every publication (~1/3 of a local copy's time here); the CUDA
  caching allocator makes it moot on GPU. A sink without it simply gets fresh tensors.
Refusals: a publication is refused -- not activated, the previous version keeps serving, every
rank returns `activated=False` with every rank's problems -- when the shards passed in are wrong
(a duplicated, missing or unknown name, a wrong shape or dtype: no transfer runs then), when its
version does not increase on the last activated one (a rewound `next_version`, a version < 1), or
when validation fails on any engine rank (checksum, NaN/Inf, uncovered bytes, missing tensors).
What the run does next is the loop's policy (loop/placement/publication.py), not the publisher's.

Memory: the staged copy is one extra copy of what the rank receives -- its own shards with
in-place delivery (model / engine TP), the whole model with loader delivery (vLLM's CPU build
slices after loading) -- alive from staging until activation. That copy is the price of never
serving a half-written policy; the transfer itself adds at most one bucket plus the largest piece.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist

from megatron_rl.models.dtypes import torch_dtype
from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel.layout import ParallelLayout
from megatron_rl.reshard.checksum import default_algorithm, digest_size
from megatron_rl.reshard.manifest import Manifest, Run, expected_manifest, validate
from megatron_rl.reshard.plan import Links, ReshardPlan, build_plan
from megatron_rl.reshard.transfer import DIRECT_MIN_BYTES, RecvHook, TransferStats, run_transfer


class EngineSink(Protocol):
    @property
    def active_version(self) -> int | None: ...

    def stage(self, version: int, tensors: dict[str, torch.Tensor]) -> None: ...

    def staged(self, version: int) -> Mapping[str, torch.Tensor]: ...

    def activate(self, version: int) -> None: ...

    def discard(self, version: int) -> None: ...


class InMemorySink:
    """The reference sink: versions held as dicts of tensors; `tensors()` is what the engine serves.

    Hands retired versions back to the publisher (`take_retired`): a mapping from `tensors()` stays
    valid until the next publication activates or is rejected; clone what you keep longer.
    """

    def __init__(self) -> None:
        self._staged: dict[int, dict[str, torch.Tensor]] = {}
        self._active: dict[str, torch.Tensor] = {}
        self._retired: dict[str, torch.Tensor] = {}
        self.active_version: int | None = None
        self._previous: tuple[int, dict[str, torch.Tensor]] | None = None  # what activation replaced

    def stage(self, version: int, tensors: dict[str, torch.Tensor]) -> None:
        if version in self._staged:
            raise RuntimeError(f"version {version} is already staged")
        self._staged[version] = tensors

    def staged(self, version: int) -> dict[str, torch.Tensor]:
        return self._staged[version]

    def activate(self, version: int) -> None:
        self._retired, self._active = self._active, self._staged.pop(version)
        self._previous = (self.active_version, self._retired) if self.active_version is not None else None
        self.active_version = version

    def discard(self, version: int) -> None:
        self._retired = self._staged.pop(version, {})

    def roll_back(self) -> int | None:
        """Serve again the version the last activation replaced; None when there was none."""
        kept, self._previous = self._previous, None
        self._active, self.active_version = (kept[1], kept[0]) if kept else ({}, None)
        self._retired = {}
        return self.active_version

    def settle(self) -> None:
        self._previous = None

    def take_retired(self) -> dict[str, torch.Tensor]:
        retired, self._retired = self._retired, {}
        return retired

    def tensors(self) -> Mapping[str, torch.Tensor]:
        return self._active


@dataclass
class PublishResult:
    version: int
    step: int
    activated: bool
    active_version: int | None  # after this publish, on this rank's sink
    problems: list[str]  # every rank's, "rank R: ..." (empty when activated)
    manifest: Manifest | None  # this engine rank's manifest of `version` (None off the engines)
    stats: TransferStats
    seconds: dict[str, float] = field(default_factory=dict)
    bytes_staged: int = 0
    attempts: int = 1  # publications tried this step (the loop's retry policy sets it)
    action: str = ""  # what the loop did about a refusal (loop/placement/publication.py)
    probe: dict | None = None  # the log-prob probe of the version, once activated (loop/placement/probe.py)


class Publisher:
    """One per rank; every rank must build it with the same arguments (layout, spec, delivery, bucket
    and direct-message sizes, dtype, algorithm): each derives the message schedule on its own."""

    def __init__(
        self,
        layout: ParallelLayout,
        spec: ModelSpec,
        sink: EngineSink | None = None,
        delivery: str = "inplace",
        bucket_bytes: int = 256 << 20,
        links: Links | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        algorithm: str | None = None,
        direct_min_bytes: int = DIRECT_MIN_BYTES,
        group: dist.ProcessGroup | None = None,
        cpu_group: dist.ProcessGroup | None = None,
    ):
        """`group`: the ranks the layout numbers, by their layout rank: the default group (None) when
        colocated, the job group of a separated job (loop/placement/pools.py), where the default world is a pool.
        `cpu_group`: a gloo group over the same ranks, for the problems the ranks exchange (host objects;
        NCCL would stage them on the GPU). Needed when `group` is NCCL; a gloo `group` serves itself."""
        self.group = group
        self.cpu_group = cpu_group if cpu_group is not None else group
        if cpu_group is None and dist.is_initialized() and dist.get_backend(group) == "nccl":
            raise ValueError("Publisher on an NCCL group needs cpu_group=, a gloo group over the same ranks")
        self.dtype = dtype or torch_dtype(spec.params_dtype)
        itemsize = torch.empty(0, dtype=self.dtype).element_size()
        self.plan: ReshardPlan = build_plan(layout, spec, delivery, links, itemsize)
        self.sink, self.bucket_bytes, self.direct_min_bytes = sink, bucket_bytes, direct_min_bytes
        on_gpu = torch.cuda.is_available() and (
            not dist.is_initialized() or dist.get_backend(group) == "nccl"
        )
        self.device = torch.device(device) if device else torch.device("cuda" if on_gpu else "cpu")
        self.algorithm = algorithm or default_algorithm(self.device)
        digest_size(self.algorithm)  # refuse an unknown algorithm now, not mid-publication
        self.active_manifest: Manifest | None = None
        # The version the next publish stages; a resumed run sets it (rejected versions are not reused).
        self.next_version = 1
        self.last_activated: int | None = None  # the same on every rank (activation is agreed)
        self._before: tuple[Manifest | None, int | None] = (None, None)  # what the last activation replaced
        self._spare: dict[str, torch.Tensor] = {}

    @property
    def rank(self) -> int:
        if self.group is not None:
            return self.group.rank()  # not dist.get_rank(group): see loop/placement/pools.py
        return dist.get_rank() if dist.is_initialized() else 0

    def publish(
        self, named_params: Iterable[tuple[str, torch.Tensor]], step: int, recv_hook: RecvHook | None = None
    ) -> PublishResult:
        """Move this rank's shards to the engines and activate the new version if it is whole."""
        t0 = time.perf_counter()
        rank, plan = self.rank, self.plan
        version, self.next_version = self.next_version, self.next_version + 1
        targets = plan.targets.get(rank, {})
        if targets and self.sink is None:
            raise RuntimeError(f"rank {rank} is an engine rank of the layout but its Publisher has no sink")
        sources, problems = self._check_sources(named_params, rank)
        problems = self._all_problems(problems + self._check_version(version))
        if problems:  # nothing moves: every rank returns the same refusal
            return self._refused(version, step, problems, time.perf_counter() - t0)
        staged = {n: self._buffer(n, t.shape) for n, t in targets.items()}
        self._spare = {}
        for name, lay in targets.items():
            off = 0
            for seg in lay.segments:
                if seg.hf is None:  # zero padding is written here, never sent
                    staged[name].narrow(lay.dim, off, seg.length).zero_()
                off += seg.length
        t1 = time.perf_counter()
        digests, stats = run_transfer(
            plan,
            rank,
            sources,
            staged,
            self.bucket_bytes,
            self.algorithm,
            recv_hook,
            direct_min_bytes=self.direct_min_bytes,
            device=self.device,
            group=self.group,
        )
        t2 = time.perf_counter()
        problems, manifest = [], None
        if targets:
            runs = self._runs(rank, digests)
            itemsize = torch.empty(0, dtype=self.dtype).element_size()
            shapes = {n: t.shape for n, t in targets.items()}
            manifest = expected_manifest(version, step, self.algorithm, shapes, self.dtype, runs, itemsize)
            self.sink.stage(version, staged)
            del staged
            problems = [f"rank {rank}: {p}" for p in validate(self.sink.staged(version), manifest, runs)]
        t3 = time.perf_counter()
        problems = self._all_problems(problems)
        if targets:
            if problems:
                self.sink.discard(version)
            else:
                self.sink.activate(version)
            take = getattr(self.sink, "take_retired", None)
            self._spare = take() if take is not None else {}
        if not problems:
            self._before = (self.active_manifest, self.last_activated)
            self.active_manifest, self.last_activated = manifest, version
        t4 = time.perf_counter()
        secs = dict(stage_alloc=t1 - t0, transfer=t2 - t1, validate=t3 - t2, activate=t4 - t3, total=t4 - t0)
        return PublishResult(
            version=version,
            step=step,
            activated=not problems,
            active_version=self.sink.active_version if self.sink is not None else None,
            problems=problems,
            manifest=manifest,
            stats=stats,
            seconds=secs,
            bytes_staged=plan.target_bytes(rank),
        )

    def roll_back(self, result: PublishResult, problems: list[str]) -> PublishResult:
        """The version `result` activated is refused after all (its log-prob probe disagreed,
        loop/placement/probe.py): the engines serve again the version active before it, where their sinks kept it
        (`VLLMEngineSink(keep_previous=True)`; else they serve nothing until the next activation), and
        `result` becomes a refusal with `problems`. Every rank calls it with the same verdict."""
        self._spare = {}  # the replaced version's tensors may serve again: never stage into them
        if self.sink is not None and hasattr(self.sink, "roll_back"):
            self.sink.roll_back()
        elif self.sink is not None:
            raise RuntimeError(f"{type(self.sink).__name__} cannot roll back a version (no roll_back())")
        self.active_manifest, self.last_activated = self._before
        result.activated = False
        result.problems = list(problems)
        result.active_version = self.sink.active_version if self.sink is not None else self.last_activated
        return result

    def settle(self) -> None:
        """The active version passed its probe: the sink drops what it kept to roll back."""
        if self.sink is not None and hasattr(self.sink, "settle"):
            self.sink.settle()

    def serving(self) -> int | None:
        """The version the engines can serve right now: `last_activated`, or None when there is none or
        any engine rank's sink no longer holds its weights (`holds_weights`; a level-2 sleep discards
        them). Collective when torch.distributed is up: every rank calls it and gets the same answer."""
        holds = self.sink is None or getattr(self.sink, "holds_weights", True)
        if dist.is_initialized():
            flag = torch.tensor([1 if holds else 0], device=self._comm_device())
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
            holds = bool(flag.item())
        return self.last_activated if holds else None

    # ---- helpers ----
    def _buffer(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """Staging memory: a retired version's tensor of the same shape if the sink handed one back."""
        t = self._spare.get(name)
        if (
            t is not None
            and tuple(t.shape) == tuple(shape)
            and t.dtype == self.dtype
            and t.device == self.device
        ):
            return t
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def _runs(self, rank: int, digests: Mapping[int, bytes]) -> dict[str, list[Run]]:
        """Per staged tensor: its runs in offset order, pieces with their senders' digests, padding."""
        out: dict[str, list[Run]] = {}
        for name, lay in self.plan.targets.get(rank, {}).items():
            runs = []
            off = 0
            for seg in lay.segments:
                if seg.hf is None:
                    runs.append(Run(lay.dim, off, seg.length, None))
                off += seg.length
            for i in self.plan.by_target[(rank, name)]:
                p = self.plan.pieces[i]
                # A digest that never arrived cannot match anything recomputed from the bytes.
                runs.append(Run(p.dim, p.dst_off, p.length, digests.get(i, b"never arrived")))
            out[name] = sorted(runs, key=lambda r: r.offset)
        return out

    def _check_sources(
        self, named_params: Iterable[tuple[str, torch.Tensor]], rank: int
    ) -> tuple[dict[str, torch.Tensor], list[str]]:
        """This rank's shards by name, and what is wrong with them (empty when they match the plan)."""
        expected = self.plan.sources.get(rank, {})
        got: dict[str, torch.Tensor] = {}
        duplicated = []
        for name, t in named_params:
            if name in got:
                duplicated.append(name)
            got[name] = t.detach()
        needed = {p.src_name for p in self.plan.pieces if p.src == rank}
        problems = []
        if duplicated:
            problems.append(
                f"rank {rank} passed {sorted(set(duplicated))[:4]} more than once (which copy is the policy?)"
            )
        unknown = sorted(set(got) - set(expected))
        if unknown:
            role = "a trainer rank" if expected else "not a trainer rank of the layout (pass nothing)"
            problems.append(
                f"rank {rank} passed tensors the plan does not expect here ({role}): {unknown[:4]}"
            )
        missing = sorted(needed - set(got))
        if missing:
            problems.append(
                f"rank {rank} did not pass {missing[:4]}: pass policy.named_parameters_global() on every "
                "trainer rank"
            )
        for name, t in got.items():
            if name not in expected:
                continue
            if tuple(t.shape) != expected[name].shape:
                problems.append(
                    f"rank {rank}: {name} has shape {list(t.shape)}, the layout says {list(expected[name].shape)}"
                )
            elif t.dtype != self.dtype:
                problems.append(
                    f"rank {rank}: {name} is {t.dtype}, the publisher was built for {self.dtype} "
                    f"(pass Publisher(dtype=...) = the trainer's parameter dtype)"
                )
        return got, problems[:8]

    def _check_version(self, version: int) -> list[str]:
        """A version must be >= 1 and above every version activated before (here or on this sink)."""
        floor = max(
            v
            for v in (0, self.last_activated, self.sink.active_version if self.sink else None)
            if v is not None
        )
        if version <= floor:
            return [
                f"rank {self.rank}: version {version} does not increase on the active version {floor} "
                "(Publisher.next_version was set back)"
            ]
        return []

    def _refused(self, version: int, step: int, problems: list[str], seconds: float) -> PublishResult:
        return PublishResult(
            version=version,
            step=step,
            activated=False,
            active_version=self.sink.active_version if self.sink is not None else None,
            problems=problems,
            manifest=None,
            stats=TransferStats(),
            seconds={"total": seconds},
        )

    def _all_problems(self, problems: list[str]) -> list[str]:
        if not dist.is_initialized():
            return problems
        flag = torch.tensor([1 if problems else 0], device=self._comm_device())
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        if not flag.item():
            return []
        every: list[list[str]] = [[] for _ in range(dist.get_world_size(self.cpu_group))]
        dist.all_gather_object(every, problems, group=self.cpu_group)
        return [p for ps in every for p in ps]

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend(self.group) == "nccl" else torch.device("cpu")
