"""The trainer's policy: a megatron-core GPTModel stage, its DDP wrapper and distributed optimizer.

Two operations, both through megatron-core's pipeline schedules so that any TP x PP x DP layout
runs the same code:
- `logprobs(...)`: teacher-forced per-token log-probs (forward only), returned on every rank;
- `train_step(...)`: forward/backward over the local microbatches with a caller's loss, then one
  optimizer step (distributed optimizer, gradient clipping) at the learning rate megatron-core's
  `OptimizerParamScheduler` gives that step (linear warm-up, then constant or cosine).

`head="value"` builds a value model instead (trainer/value.py: PPO's critic, a learned reward model): the
same body with a scalar head; `values(...)` gives its per-token values, `scores(...)` the value after each
sequence's last token, and `train_step`'s loss receives values where a policy's receives log-probs.

Loss scaling: the schedule divides each microbatch loss by the number of microbatches and DDP
averages gradients over DP ranks. Callers give losses already normalised by the *global* count
(tokens or sequences over all DP ranks), so `train_step` multiplies by microbatches x DP to undo
both and make the gradient equal that of the single-process loss.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from megatron_rl.models.megatron import build_gpt, transformer_config
from megatron_rl.models.spec import ModelSpec
from megatron_rl.trainer.batch import (
    Microbatch,
    completion_values,
    make_microbatches,
    padded_length,
)
from megatron_rl.trainer.logprobs import token_logprobs
from megatron_rl.trainer.parallel import ParallelState
from megatron_rl.trainer.replay import replaying, set_replay
from megatron_rl.trainer.value import attach_value_head, last_token_values, per_token_values

HEADS = ("lm", "value")

# loss_fn(logprobs_BT, microbatch) -> (loss scalar normalised by the global count, metrics dict)
LossFn = Callable[[torch.Tensor, Microbatch], tuple[torch.Tensor, dict[str, torch.Tensor]]]


@dataclass
class OptimSettings:
    """The trainer's optimizer and LR schedule, counted in *optimizer* steps.

    The recipe counts its warm-up in RL steps; `trainer/build.py optim_settings` converts. The
    defaults here are a plain constant-LR Adam (no warm-up), so that a Policy built by hand takes
    exactly the step its `lr` says; the recipe defaults live in the schema (config/schema.py).
    """

    lr: float = 1e-6
    min_lr: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    distributed_optimizer: bool = True
    lr_schedule: str = "constant"  # constant | cosine
    # Optimizer steps whose LR ramps linearly up to `lr` (step k of them uses lr * k / warmup_steps).
    warmup_steps: int = 0
    # Cosine only: the run's optimizer steps; the LR reaches `min_lr` at the last of them.
    decay_steps: int = 0

    def __post_init__(self) -> None:
        if self.lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"lr_schedule must be constant or cosine, not {self.lr_schedule!r}")
        if self.lr_schedule == "cosine" and self.decay_steps <= self.warmup_steps:
            raise ValueError(
                f"a cosine schedule needs more optimizer steps ({self.decay_steps}) than warm-up steps "
                f"({self.warmup_steps}): lower optim.warmup_steps or raise steps"
            )


class Policy:
    def __init__(
        self,
        spec: ModelSpec,
        state: ParallelState,
        dtype: str | None = None,
        optim: OptimSettings | None = None,
        micro_batch_size: int = 1,
        routing_replay: bool = False,
        head: str = "lm",
        layout=None,
    ):
        """`head`: "lm" (a policy) or "value" (a value model); `layout`: the model's own recompute and
        sequence parallelism (a ParallelLayout of the same process groups; default the state's)."""
        if head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, not {head!r}")
        self.spec, self.state, self.head = spec, state, head
        self.dtype = dtype or spec.params_dtype
        self.micro_batch_size = micro_batch_size
        self.padded_vocab = spec.padded_vocab(state.tp)
        on_cpu = state.device.type == "cpu"
        self.config = transformer_config(spec, layout or state.layout, self.dtype, on_cpu=on_cpu)
        # algorithm.routing_replay: the forwards can take the engine's experts (trainer/replay.py).
        self.routing_replay = routing_replay
        if routing_replay:
            if not spec.is_moe:
                raise ValueError("routing replay needs a mixture-of-experts model; this one is dense")
            self.config.moe_enable_routing_replay = True
        if head == "value":  # the head is its own parameter: nothing to share with the embedding
            from dataclasses import replace

            spec_built = replace(spec, tie_word_embeddings=False)
        else:
            spec_built = spec
        model = build_gpt(
            spec_built,
            self.config,
            self.padded_vocab,
            state.is_first_stage,
            state.is_last_stage,
            groups=state.groups,
        )
        if head == "value":
            attach_value_head(model, self.config, state.groups)
        self.model = model.to(state.device)
        self.ddp = None
        self.optimizer = None
        self.scheduler = None  # megatron-core's OptimizerParamScheduler, with the optimizer
        # A frozen reference may live in host memory between uses (algorithm.reference=offload).
        self.offload_between_uses = False
        self.weights_on_host = False
        if optim is not None:
            self._setup_optimizer(optim)

    # ---- setup ----
    def _setup_optimizer(self, o: OptimSettings) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=False,
            use_distributed_optimizer=o.distributed_optimizer,
        )
        groups = self.state.groups  # None: megatron-core's global groups (the trainer's layout)
        self.ddp = DistributedDataParallel(
            config=self.config, ddp_config=ddp_cfg, module=self.model, pg_collection=groups
        )
        ocfg = OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            min_lr=o.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            clip_grad=o.clip_grad,
            bf16=self.dtype == "bf16",
            fp16=self.dtype == "fp16",
            params_dtype=self.config.params_dtype,
            use_distributed_optimizer=o.distributed_optimizer,
        )
        # megatron-core makes no gloo twins of a model's own groups (their CPU-side uses are the
        # distributed optimizer's dp-zero state gathers, which the sharded checkpoints do not take)
        own = {"pg_collection": groups, "use_gloo_process_groups": False} if groups is not None else {}
        self.optimizer = get_megatron_optimizer(ocfg, [self.ddp], **own)
        self.scheduler = lr_scheduler(self.optimizer, o)
        self.config.no_sync_func = self.ddp.no_sync
        self.config.finalize_model_grads_func = finalize_model_grads

    def weights_written(self) -> None:
        """Call after writing the model's weights from outside (an HF import, a copy from another model): the
        optimizer's fp32 main copy of bf16/fp16 weights was taken when it was built, and its first step would
        put that copy back over the new weights. Without an optimizer, nothing to do."""
        if self.optimizer is not None:
            self.optimizer.reload_model_params()

    def weights_to_host(self) -> bool:
        """Move a frozen model's weights to host memory; True if device memory was released.

        Only for models without an optimizer (the reference): the policy's own weights are
        referenced by its optimizer and gradient buffers. On CPU there is nothing to release."""
        if self.optimizer is not None:
            raise RuntimeError("weights_to_host() is for frozen models (no optimizer), e.g. the reference")
        if self.state.device.type == "cpu" or self.weights_on_host:
            return False
        self.model.to("cpu")
        self.weights_on_host = True
        torch.cuda.empty_cache()
        return True

    def weights_to_device(self) -> bool:
        """Inverse of `weights_to_host`."""
        if not self.weights_on_host:
            return False
        self.model.to(self.state.device)
        self.weights_on_host = False
        return True

    @property
    def module(self):
        """The GPTModel (unwrapped), whatever wraps it."""
        return self.model

    def named_parameters_global(self):
        from megatron_rl.models.megatron import global_param_name

        for n, p in self.model.named_parameters():
            yield global_param_name(self.model, n), p

    # ---- forward passes ----
    def _run(self, mbs: list[Microbatch], forward_only: bool, step_fn) -> list[dict]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        model = self.ddp if (self.ddp is not None and not forward_only) else self.model
        seq_len = mbs[0].tokens_BS.shape[1]
        groups = self.state.groups
        if groups is None:  # the trainer's layout: megatron-core's global groups
            fb, own = get_forward_backward_func(), {}
        else:  # a layout of its own: the schedule, its p2p and the gradients' finalisation on its groups
            from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

            fb = get_forward_backward_func(pp_size=self.state.pp, vp_size=None)
            own = {"pg_collection": groups}
            if self.state.pp > 1:
                own["p2p_communicator"] = P2PCommunicator(pp_group=groups.pp, config=self.config)
        with torch.set_grad_enabled(not forward_only), replaying(self.model, mbs[0].routes is not None):
            return fb(
                forward_step_func=step_fn,
                data_iterator=iter(mbs),
                model=[model],
                num_microbatches=len(mbs),
                seq_length=seq_len,
                micro_batch_size=mbs[0].tokens_BS.shape[0],
                forward_only=forward_only,
                **own,
            )

    def _forward(self, model, mb: Microbatch) -> torch.Tensor:
        if mb.routes is not None:
            st = self.state
            set_replay(self.model, mb.routes, st.tp_rank, st.tp, st.layout.sequence_parallel)
        return model(mb.tokens_BS, mb.position_ids_BS, attention_mask=None)

    def _microbatches(
        self, sequences, prompt_lens, seq_len, extras=None, routes=None, micro_batch_size=None
    ) -> list[Microbatch]:
        """Microbatches on the policy's device (the one device rule: see trainer/batch.py). Without
        pipeline parallelism (no p2p buffer shape to keep) they are grouped by length, each padded to
        its own longest. An MoE model whose experts span ranks pads to one length over those ranks
        (`_expert_length`; on CPU only, where the dispatcher all-gathers equal blocks)."""
        mbs = micro_batch_size or self.micro_batch_size
        if seq_len is None and self.spec.is_moe and self.state.layout.ep * self.state.layout.etp > 1:
            seq_len = self._expert_length(sequences, -(-len(sequences) // mbs))
        by_length = self.state.pp == 1 and seq_len is None
        return make_microbatches(
            sequences,
            prompt_lens,
            mbs,
            seq_len,
            extras,
            device=self.state.device,
            by_length=by_length,
            routes=routes,
        )

    def _expert_length(self, sequences: list[list[int]], microbatches: int) -> int | None:
        """The one padded length of every microbatch on the ranks that share experts (EP x ETP).

        Each MoE layer's forward is a collective over those ranks: the CPU's all-gather dispatcher
        (models/megatron.py `token_dispatcher`) gathers equal-sized token blocks, and every rank must
        run the same number of microbatches. DP ranks hold different samples, so they agree here."""
        from megatron.core import parallel_state as ps

        # The GPU's all-to-all dispatcher takes any token count: only the microbatch count must agree.
        longest = padded_length([len(s) for s in sequences]) if self.state.device.type == "cpu" else 0
        mine = [longest, microbatches, -microbatches]
        agreed = torch.tensor(mine, device=self.state.device)  # the expert groups are device groups
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=ps.get_expert_tensor_and_model_parallel_group())
        length, most, fewest = (int(v) for v in agreed.cpu())
        if most != -fewest:
            raise RuntimeError(
                f"ranks sharing experts hold {-fewest}..{most} microbatches; every rank of an expert-parallel "
                "group must run the same number (give each DP rank an equal share of the samples)"
            )
        return length or None

    def _replayed(self, routes: list[torch.Tensor] | None) -> list[torch.Tensor] | None:
        if routes is not None and not self.routing_replay:
            raise ValueError("routes given to a policy built without routing_replay=True")
        return routes

    def logprobs(
        self,
        sequences: list[list[int]],
        prompt_lens: list[int],
        temperature: float = 1.0,
        seq_len: int | None = None,
        routes: list[torch.Tensor] | None = None,
        micro_batch_size: int | None = None,
    ) -> list[torch.Tensor]:
        """Per-sequence completion log-probs (1-D float32 tensors), on every rank of the model group.
        `routes`: the engine's experts per sequence, replayed (trainer/replay.py). `micro_batch_size`:
        this call's own (the log-prob probe scores its few sequences as one microbatch)."""
        self._require("lm", "logprobs")
        mbs = self._microbatches(
            sequences, prompt_lens, seq_len, routes=self._replayed(routes), micro_batch_size=micro_batch_size
        )
        values = self._forward_only(mbs, lambda out, mb: self._per_token(out, mb, temperature))
        return completion_values(values, mbs, prompt_lens)

    def values(
        self, sequences: list[list[int]], prompt_lens: list[int], micro_batch_size: int | None = None
    ) -> list[torch.Tensor]:
        """A value model's per-completion-token values (1-D float32, the value of the state before each
        token), on every rank of the model group."""
        self._require("value", "values")
        mbs = self._microbatches(sequences, prompt_lens, None, micro_batch_size=micro_batch_size)
        outs = self._forward_only(mbs, lambda out, mb: per_token_values(out))
        return completion_values(outs, mbs, prompt_lens)

    def scores(self, sequences: list[list[int]], micro_batch_size: int | None = None) -> list[float]:
        """A value model's value after each sequence's last token (a reward model's score), on every rank."""
        self._require("value", "scores")
        mbs = self._microbatches(sequences, [1] * len(sequences), None, micro_batch_size=micro_batch_size)
        outs = self._forward_only(
            mbs, lambda out, mb: last_token_values(out, mb.lengths), lambda mb: (len(mb.index), 1)
        )
        found: list[float] = [0.0] * len(sequences)
        for values, mb in zip(outs, mbs):
            for b, i in enumerate(mb.index):
                found[i] = float(values[b, 0])
        return found

    def _whole_minibatch(self, outs: list[dict]) -> dict[str, float]:
        """The loss function's metrics of the whole minibatch, the same on every rank (`_combine`'s rules).

        Each rank's microbatches hold its DP share only, and only on the last pipeline stage (the schedule
        returns nothing elsewhere); the step record is written by rank 0, on the first stage. So one rank per
        DP share (the last stage's TP rank 0: its TP peers computed the same numbers) gives its microbatches'
        numbers, gathered over the host group, and all of them combine as one rank's microbatches do: a loss
        normalised by the global count adds up to the minibatch's, means weigh by tokens over every share.
        Collective over every rank (an object gather of a few floats per microbatch)."""
        mine: list[dict[str, float]] = []  # a stage before the last has no microbatch outputs
        if outs:  # one copy to the host for all the numbers (on a GPU, one synchronisation, not one each)
            keys = list(outs[0])
            rows = torch.stack([torch.stack([o[k].float().reshape(()) for k in keys]) for o in outs])
            mine = [dict(zip(keys, row)) for row in rows.tolist()]
        world = dist.get_world_size(self.state.cpu_group)
        if world == 1:
            return _combine(mine)
        coord = self.state.coord
        speaks = self.state.is_last_stage and coord.tp == 0 and coord.cp == 0
        parts: list = [None] * world
        dist.all_gather_object(parts, mine if speaks else None, group=self.state.cpu_group)
        return _combine([o for part in parts if part for o in part])

    def _require(self, head: str, what: str) -> None:
        if self.head != head:
            raise RuntimeError(
                f"{what}() needs a model built with head={head!r}; this one has head={self.head!r}"
            )

    def _per_token(self, out: torch.Tensor, mb: Microbatch, temperature: float) -> torch.Tensor:
        """What a loss sees per predicted position [B, S - 1]: log-probs of the next token, or values."""
        if self.head == "value":
            return per_token_values(out)
        return token_logprobs(out, mb.tokens_BS, self.spec.vocab_size, temperature, self.state.tp_rank)

    def _forward_only(self, mbs: list[Microbatch], take, shape=None) -> list[torch.Tensor]:
        """take(output, microbatch) -> a tensor per microbatch on the last stage, on every stage after; on
        the host. `shape(mb)`: its shape, for the stages that receive it (default the loss mask's)."""

        def step(data_iter, model):
            mb = next(data_iter)
            out = self._forward(model, mb)

            def loss_func(output):
                value = take(output, mb)
                return value.sum() * 0.0, {"value": value.detach()}

            return out, loss_func

        self.model.eval()
        self.weights_to_device()
        try:
            outs = self._run(mbs, forward_only=True, step_fn=step)
        finally:
            if self.offload_between_uses:
                self.weights_to_host()
        values = [o["value"] for o in outs] if self.state.is_last_stage else None
        values = self._broadcast_from_last_stage(values, mbs, shape)
        # Back to the host only now: the broadcast ran on megatron's pipeline group (NCCL on GPU).
        return [v.cpu() for v in values]

    def _broadcast_from_last_stage(
        self, values: list[torch.Tensor] | None, mbs: list[Microbatch], shape=None
    ):
        """Send the last PP stage's [B, T] tensors (`shape(mb)` when given) to every stage (others allocate
        and receive).

        The tensors stay on the policy's device: the pipeline group is NCCL on GPU, which refuses
        host tensors."""
        if self.state.pp == 1:
            return values
        if self.state.groups is not None:
            group = self.state.groups.pp
            src = dist.get_global_rank(group, self.state.pp - 1)
        else:
            from megatron.core import parallel_state as ps

            src = ps.get_pipeline_model_parallel_last_rank()
            group = ps.get_pipeline_model_parallel_group()
        if values is None:
            values = [
                torch.empty(
                    shape(mb) if shape else mb.loss_mask_BT.shape,
                    dtype=torch.float32,
                    device=self.state.device,
                )
                for mb in mbs
            ]
        # gloo sends a tensor's storage as laid out in memory: a transposed view would arrive scrambled.
        values = [v.contiguous() for v in values]
        for v in values:
            dist.broadcast(v, src=src, group=group)
        return values

    def train_step(
        self,
        sequences: list[list[int]],
        prompt_lens: list[int],
        loss_fn: LossFn,
        extras: dict[str, list[torch.Tensor]] | None = None,
        temperature: float = 1.0,
        seq_len: int | None = None,
        timer=None,
        return_logprobs: bool = False,
        routes: list[torch.Tensor] | None = None,
    ):
        """One optimizer step over this DP rank's sequences. Returns metrics (grad_norm, loss, ...).

        With a telemetry `timer`, forward/backward and the optimizer step are timed as the phases
        `train_fwd_bwd` and `optimizer`. With `return_logprobs`, returns (metrics, log-probs): the
        per-sequence completion log-probs of this step's forward, taken before the update (as
        `logprobs()` gives them, on every rank), so a caller whose samples were drawn with these very
        weights can check them against the engine's without another forward pass.
        """
        from megatron.core.optimizer_param_scheduler import get_canonical_lr_for_logging

        if self.optimizer is None:
            raise RuntimeError("Policy was built without an optimizer (pass optim=OptimSettings(...))")
        mbs = self._microbatches(sequences, prompt_lens, seq_len, extras, self._replayed(routes))
        scale = len(mbs) * self.state.dp
        forward_lp: list[torch.Tensor] = []  # [B, T] per microbatch, in schedule order (last stage only)

        def step(data_iter, model):
            mb = next(data_iter)
            out = self._forward(model, mb)

            def loss_func(output):
                lp = self._per_token(output, mb, temperature)  # log-probs, or a value model's values
                if return_logprobs:
                    forward_lp.append(lp.detach())
                loss, metrics = loss_fn(lp, mb)  # mb (extras included) is on the policy's device
                return loss * scale, {
                    "loss": loss.detach().clone(),
                    **{k: v.detach() for k, v in metrics.items()},
                }

            return out, loss_func

        self.model.train()
        self.optimizer.zero_grad()
        self.ddp.zero_grad_buffer()
        with timer.phase("train_fwd_bwd") if timer else nullcontext():
            outs = self._run(mbs, forward_only=False, step_fn=step)
        # The scheduler counts optimizer steps taken; stepping it first gives the k-th step (k from 1)
        # the LR of step k, so no step of the warm-up runs at LR 0.
        self.scheduler.step(1)
        lr = get_canonical_lr_for_logging(self.optimizer.param_groups)
        with timer.phase("optimizer") if timer else nullcontext():
            ok, grad_norm, _ = self.optimizer.step()
        if not ok:  # a skipped update (fp16 overflow) does not advance the schedule, as in megatron-core
            self.scheduler.step(-1)
        metrics: dict[str, float] = {"grad_norm": float(grad_norm) if grad_norm is not None else float("nan")}
        metrics["update_successful"] = float(bool(ok))
        metrics["lr"] = float(lr) if lr is not None else float("nan")
        metrics.update(self._whole_minibatch(outs))
        if not return_logprobs:
            return metrics
        values = self._broadcast_from_last_stage(forward_lp if self.state.is_last_stage else None, mbs)
        return metrics, completion_values([v.cpu() for v in values], mbs, prompt_lens)


def lr_scheduler(optimizer, o: OptimSettings):
    """megatron-core's own scheduler for `o`'s schedule, weight decay held constant.

    The recipe is the truth on resume (`override_opt_param_scheduler`): a checkpoint restores only
    how many optimizer steps were taken (checkpoint/resume.py), so the same recipe continues the
    schedule exactly and an edited one (more steps, another lr) takes effect from there."""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    # megatron asserts warm-up < decay steps even for a constant LR, whose decay length is unused.
    decay = o.decay_steps if o.lr_schedule == "cosine" else o.warmup_steps + 1
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=o.lr,
        min_lr=min(o.min_lr, o.lr),
        lr_warmup_steps=o.warmup_steps,
        lr_decay_steps=decay,
        lr_decay_style=o.lr_schedule,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=decay,
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
    )


_SUMMED = {"loss", "pg_loss", "value_loss", "tokens"}


def _combine(outs: list[dict[str, float]]) -> dict[str, float]:
    """Microbatch metrics (of one rank or of every DP share's) -> one value each: losses (already globally
    normalised) and token counts add up; *_max keys take the max; the rest are token-weighted means when
    `tokens` is reported, plain means otherwise."""
    if not outs:
        return {}
    keys = [k for k in outs[0] if all(k in o for o in outs)]
    w = [o["tokens"] for o in outs] if "tokens" in keys else None
    out = {}
    for k in keys:
        v = [o[k] for o in outs]
        if k in _SUMMED:
            out[k] = sum(v)
        elif k.endswith("_max"):
            out[k] = max(v)
        elif w is not None and sum(w) > 0:
            out[k] = sum(x * t for x, t in zip(v, w)) / sum(w)
        else:
            out[k] = sum(v) / len(v)
    return out
