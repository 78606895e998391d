"""ModelSpec -> megatron-core `TransformerConfig` and `GPTModel`.

Model code knows nothing of parallelism: the parallel sizes come in as plain arguments and go
straight into megatron-core's own config. The transformer-engine layer spec is used when it
imports (clusters, NGC containers); otherwise the local spec, which is what runs on CPU.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

from megatron_rl.models.dtypes import recipe_dtype, torch_dtype
from megatron_rl.models.experts import GROUPED, expert_gemm, grouped_to_per_expert
from megatron_rl.models.hf import canonical_name
from megatron_rl.models.spec import ModelSpec
from megatron_rl.parallel.layout import ParallelLayout


@functools.cache
def transformer_engine_available() -> bool:
    """Whether transformer-engine's layer spec can be built here: CUDA, and TE's PyTorch module imports.

    Asked through `transformer_engine.pytorch` itself: TE's package `__init__` swallows a failed import
    of its PyTorch module, so `import transformer_engine` succeeds on a TE whose torch extension is
    missing or was built for another torch, and the TE spec would then fail deep in the model build.
    Such a TE counts as unavailable, with a warning naming the import error (`megatron-rl doctor`
    refuses it for GPU runs before any rank starts)."""
    if not torch.cuda.is_available():
        return False
    from megatron_rl.system.machine import TE_INSTALL, dist_version, te_import_error

    problem = te_import_error()
    if problem is not None:
        logging.getLogger(__name__).warning(
            "transformer-engine %s is installed but transformer_engine.pytorch does not import (%s): building "
            "with megatron-core's local layer spec (no fused kernels, per-expert MoE GEMMs). Rebuild it "
            "against this torch: %s",
            dist_version("transformer-engine") or "",
            problem,
            TE_INSTALL,
        )
        return False
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


def transformer_config(
    spec: ModelSpec,
    par: ParallelLayout,
    dtype: str | None = None,
    on_cpu: bool = True,
    use_te: bool | None = None,
):
    """The megatron-core TransformerConfig for a spec at a layout's TP/PP/CP, sequence parallelism,
    recompute and PP split. `use_te`: whether the model is built with transformer-engine's layer spec
    (None: whether it can be here, as `layer_spec` decides); a mixture of experts then runs grouped GEMMs."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    use_te = (not on_cpu and transformer_engine_available()) if use_te is None else use_te

    dtype = recipe_dtype(dtype or spec.params_dtype)
    tdtype = torch_dtype(dtype)
    kwargs = dict(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.ffn_hidden_size,
        num_attention_heads=spec.num_attention_heads,
        num_query_groups=spec.num_query_groups,
        kv_channels=spec.head_dim,
        gated_linear_unit=True,
        activation_func=F.silu,
        normalization="RMSNorm",
        layernorm_epsilon=spec.norm_eps,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=tdtype,
        pipeline_dtype=tdtype,
        bf16=dtype == "bf16",
        fp16=dtype == "fp16",
        tensor_model_parallel_size=par.tp,
        pipeline_model_parallel_size=par.pp,
        context_parallel_size=par.cp,
        sequence_parallel=par.sequence_parallel and par.tp > 1,
        use_cpu_initialization=on_cpu,
        # Fusions need CUDA kernels (apex / TE); the unfused paths compute the same maths.
        persist_layer_norm=False,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        # On CPU the p2p sends of a pipeline run unbatched-sync-free (gloo has no streams).
        batch_p2p_sync=not on_cpu,
    )
    if spec.is_moe:
        kwargs.update(moe_config(spec, par, on_cpu, grouped=expert_gemm(use_te) == GROUPED))
    if par.pp_layers:
        if len(par.pp_layers) != par.pp:
            raise ValueError(f"layout.pp_layers has {len(par.pp_layers)} entries for pp={par.pp}")
        # megatron-core expresses an uneven split as first/last stage sizes with an even middle.
        kwargs["num_layers_in_first_pipeline_stage"] = par.pp_layers[0]
        kwargs["num_layers_in_last_pipeline_stage"] = par.pp_layers[-1]
    if par.recompute != "none":
        kwargs["recompute_granularity"] = par.recompute
        if par.recompute == "full":
            kwargs["recompute_method"] = "uniform"
            kwargs["recompute_num_layers"] = 1
    return TransformerConfig(**kwargs)


def token_dispatcher(on_cpu: bool) -> str:
    """The MoE token dispatcher: how tokens reach the experts of other EP ranks.

    - GPU: `alltoall`, megatron-core's default for EP: each rank sends every token only to the EP ranks
      holding its experts (all-to-all over NCCL), the least traffic of the three.
    - CPU (gloo): `allgather`. Probed on megatron-core 0.16.1 over 2 gloo processes (forward,
      backward and routing replay at EP1 and EP2): it needs only the `te_general_gemm` patch
      (trainer/cpu_compat.py) that every dispatcher needs. `alltoall` also creates a
      `torch.cuda.Stream` in its constructor and syncs its split sizes device-to-host on that stream
      (token_dispatcher.py, `MoEAlltoAllTokenDispatcher`), which fails without CUDA; `flex` is
      DeepEP/HybridEP, CUDA kernels only. All-gather moves every token to every EP rank, which is
      cheap at the sizes a CPU runs.
    """
    return "allgather" if on_cpu else "alltoall"


def moe_config(spec: ModelSpec, par: ParallelLayout, on_cpu: bool, grouped: bool = False) -> dict:
    """The TransformerConfig keys of a Qwen3-MoE model: every layer routed, no shared expert; `grouped`:
    the experts' GEMMs in one grouped call (transformer-engine; models/experts.py), else one per expert.

    HF's router takes a softmax over all experts, then the top k, renormalised when `norm_topk_prob`;
    megatron-core's `moe_router_pre_softmax=False` takes the top-k logits and a softmax over them, which
    is the same renormalised weights, and `True` the softmax over all without renormalising."""
    losses = []
    if spec.moe_aux_loss_coeff > 0:
        losses.append("aux_loss")
    return dict(
        num_moe_experts=spec.num_experts,
        moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
        moe_router_topk=spec.moe_topk,
        # The router's matmul and softmax in fp32, as transformers and vLLM compute them: in bf16, tokens
        # near a tie would go to other experts than the engine chose.
        moe_router_dtype="fp32",
        moe_router_pre_softmax=not spec.moe_norm_topk_prob,
        moe_router_load_balancing_type=losses[0] if losses else "none",
        moe_aux_loss_coeff=spec.moe_aux_loss_coeff,
        moe_z_loss_coeff=spec.moe_z_loss_coeff or None,
        moe_token_dispatcher_type=token_dispatcher(on_cpu),
        moe_grouped_gemm=grouped,  # grouped names map to models/hf.py's per-expert ones (global_param_name)
        moe_permute_fusion=False,
        moe_router_fusion=False,
        expert_model_parallel_size=par.ep,
        expert_tensor_parallel_size=par.etp,
    )


def moe_spec_args(spec: ModelSpec, use_te: bool) -> dict:
    """The layer-spec arguments of a mixture of experts: grouped GEMMs with TE (TEGroupedMLP), per expert
    without (SequentialMLP); none for a dense model."""
    return (
        dict(num_experts=spec.num_experts, moe_grouped_gemm=expert_gemm(use_te) == GROUPED)
        if spec.is_moe
        else {}
    )


def layer_spec(spec: ModelSpec, use_te: bool | None = None):
    from megatron.core.models.gpt import gpt_layer_specs as S

    use_te = transformer_engine_available() if use_te is None else use_te
    moe = moe_spec_args(spec, use_te)
    if use_te:
        return S.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_norm, **moe)
    return S.get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=spec.qk_norm, **moe)


def build_gpt(
    spec: ModelSpec,
    config,
    padded_vocab: int,
    pre_process: bool,
    post_process: bool,
    use_te=None,
    groups=None,
):
    """A GPTModel for one PP stage. Call after `parallel_state.initialize_model_parallel`. `groups`: a
    ProcessGroupCollection for a model at a layout of its own (trainer/model_groups.py); None = the global
    groups. The model never sees which: megatron-core's modules take the groups they are given."""
    from megatron.core.models.gpt import GPTModel

    own = {"pg_collection": groups} if groups is not None else {}
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec(spec, use_te),
        vocab_size=padded_vocab,
        max_sequence_length=spec.max_position_embeddings,
        pre_process=pre_process,
        post_process=post_process,
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(spec.rope_theta) if float(spec.rope_theta).is_integer() else spec.rope_theta,
        parallel_output=True,
        **own,
    )
    apply_rope_scaling(model, spec)
    return model


def apply_rope_scaling(model, spec: ModelSpec) -> None:
    """Scale the model's RoPE frequencies as the checkpoint says (Llama-3.1: `rope_scaling` llama3).

    megatron-core's `GPTModel(rope_scaling=True)` takes only the factor and fixes the other llama3
    parameters at Llama-3.1's values (original context 8192); the checkpoint's own values are applied
    here with megatron-core's implementation (`RotaryEmbedding._apply_scaling`), before any forward.
    """
    if spec.rope_scaling == "none":
        return
    if spec.rope_scaling != "llama3":
        raise ValueError(f"model.rope_scaling={spec.rope_scaling!r} is not implemented (none | llama3)")
    rope = model.rotary_pos_emb
    rope.inv_freq = rope._apply_scaling(
        rope.inv_freq,
        factor=spec.rope_scaling_factor,
        low_freq_factor=spec.rope_low_freq_factor,
        high_freq_factor=spec.rope_high_freq_factor,
        original_max_position_embeddings=spec.rope_original_max_position,
    )


@functools.cache
def global_param_name(model, local_name: str) -> str:
    """The name every consumer (HF import, publication, export) uses for a parameter of this stage:
    the global layer index (state-dict keys on a PP stage count from the stage's first layer) and the
    local spec's naming, whichever layer spec built the model (models/hf.py `canonical_name`), with a
    grouped MoE's expert weights named per expert (models/experts.py)."""
    parts = local_name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        parts = grouped_to_per_expert(parts)  # TEGroupedMLP's weight{i} -> local_experts.{i}.weight
        layer = model.decoder.layers[int(parts[2])]
        parts[2] = str(layer.layer_number - 1)
        if parts[3:6] == ["mlp", "experts", "local_experts"]:  # this EP rank's experts count from 0
            parts[6] = str(layer.mlp.local_expert_indices[int(parts[6])])
    return canonical_name(".".join(parts))
