"""ModelSpec -> megatron-core `TransformerConfig` and `GPTModel`.

Model code knows nothing of parallelism: the parallel sizes come in as plain arguments and go
straight into megatron-core's own config. The transformer-engine layer spec is used when it
imports (clusters, NGC containers); otherwise the local spec, which is what runs on CPU.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from megatron_rl.layout import ParallelLayout
from megatron_rl.models.dtypes import recipe_dtype, torch_dtype
from megatron_rl.models.spec import ModelSpec


def transformer_engine_available() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


def transformer_config(spec: ModelSpec, par: ParallelLayout, dtype: str | None = None, on_cpu: bool = True):
    """The megatron-core TransformerConfig for a spec at a layout's TP/PP/CP, sequence parallelism,
    recompute and PP split."""
    from megatron.core.transformer.transformer_config import TransformerConfig

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


def layer_spec(spec: ModelSpec, use_te: bool | None = None):
    from megatron.core.models.gpt import gpt_layer_specs as S

    use_te = transformer_engine_available() if use_te is None else use_te
    if use_te:
        return S.get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_norm)
    return S.get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=spec.qk_norm)


def build_gpt(spec: ModelSpec, config, padded_vocab: int, pre_process: bool, post_process: bool, use_te=None):
    """A GPTModel for one PP stage. Call after `parallel_state.initialize_model_parallel`."""
    from megatron.core.models.gpt import GPTModel

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
def fused_to_local_prefixes() -> dict[str, str]:
    """transformer-engine's fused-norm name prefixes -> the local spec's, within a layer.

    Read from megatron-core itself: the local spec's `sharded_state_dict_keys_map` is how megatron
    keeps local-spec checkpoints loadable by TE models ({'input_layernorm.':
    'self_attention.linear_qkv.layer_norm_', ...}); inverted, it names every parameter the TE spec
    fuses. The local spec imports without transformer-engine, so this works on any machine."""
    from megatron.core.models.gpt import gpt_layer_specs as S

    keys_map = S.get_gpt_layer_local_spec(normalization="RMSNorm").submodules.sharded_state_dict_keys_map
    return {fused: local for local, fused in keys_map.items()}


def global_param_name(model, local_name: str) -> str:
    """The name every consumer (HF import, publication, export) uses for a parameter of this stage:
    the global layer index (state-dict keys on a PP stage count from the stage's first layer) and the
    local spec's naming, whichever layer spec built the model (models/hf.py `canonical_name`)."""
    from megatron_rl.models.hf import canonical_name

    parts = local_name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        parts[2] = str(model.decoder.layers[int(parts[2])].layer_number - 1)
    return canonical_name(".".join(parts))
