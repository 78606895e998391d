"""Tokens per step and the FLOPs of every compute-bound phase.

Counting convention (the one every formula here and its tests share): a matmul of an m x n weight
costs 2mn FLOPs per token forward and twice that backward, so a forward is 2·P per token and a
training step 6·P, with P = `PlanInputs.matmul_params` (for a mixture of experts the *active*
parameters: router and top-k experts, not all experts; memory counts all of them). Causal attention adds, per layer and per
query at position t (attending to t keys), 2·t·q_size FLOPs for Q·K^T and as many for the
attention-weighted sum of V: forward over a sequence of S tokens

    attn_fwd(S) = 4 · L · q_size · (1 + 2 + ... + S) = 2 · L · q_size · S · (S + 1)

and three times that to train. Sequences are planned at the mean prompt and completion lengths;
attention grows with S², so a heavy tail makes the real attention term somewhat larger (it is a
few percent of the total for the reference recipe).

Training runs `algorithm.epochs` passes over the minibatches: the policy's (and the critic's) training
FLOPs and recompute are that many times one pass. Each model counts its own matmul parameters
(plan/models.py): PPO's critic has a one-output value head instead of the vocabulary's output layer,
so its forward is the policy's body forward (old values: one forward over every sample) and its
training 3 x that per pass; a learned reward model runs one forward over every sequence.
"""

from __future__ import annotations

from megatron_rl.plan.inputs import PlanInputs
from megatron_rl.plan.models import LM, SCORE, VALUE, critic_view, matmul_params_of, reward_view


def attention_fwd_flops(inp: PlanInputs, seq_tokens: int) -> float:
    """Causal attention forward FLOPs of one sequence of `seq_tokens` tokens, all layers."""
    s = inp.spec
    return 2.0 * s.num_layers * s.q_size * seq_tokens * (seq_tokens + 1)


def tokens_per_step(inp: PlanInputs) -> dict:
    """Prompt tokens counted once per sample (every sample's sequence holds its prompt)."""
    w = inp.work
    return {
        "sequences": w.samples,
        "prompt": w.samples * w.prompt_tokens,
        "prompt_unique": w.prompts * w.prompt_tokens,
        "completion": w.samples * w.completion_tokens,
        "trained": w.samples * w.sequence_tokens,
        "per_sample": {
            "prompt": w.prompt_tokens,
            "completion": w.completion_tokens,
            "completion_cap": w.max_new_tokens,
        },
    }


def train_flops(inp: PlanInputs) -> float:
    """Policy training: every minibatch of every pass (algorithm.epochs) is one forward and backward
    over its share of the batch."""
    w = inp.work
    per_seq = 6.0 * inp.matmul_params * w.sequence_tokens + 3.0 * attention_fwd_flops(inp, w.sequence_tokens)
    return w.epochs * (w.samples * per_seq)


def recompute_extra_flops(inp: PlanInputs, recompute: str) -> float:
    """FLOPs added by activation recomputation: full redoes each layer's forward, selective the attention;
    once per training pass (algorithm.epochs)."""
    w = inp.work
    if recompute == "full":
        return w.epochs * (
            w.samples
            * (
                2.0 * inp.spec.num_layers * inp.spec.layer_params(active=True) * w.sequence_tokens
                + attention_fwd_flops(inp, w.sequence_tokens)
            )
        )
    if recompute == "selective":
        return w.epochs * (w.samples * attention_fwd_flops(inp, w.sequence_tokens))
    return 0.0


def forward_flops(inp: PlanInputs, head: str = LM) -> float:
    """One forward of `inp.spec` (with `head`) over every sample of the step."""
    w = inp.work
    mm = matmul_params_of(inp.spec, head)
    return w.samples * (2.0 * mm * w.sequence_tokens + attention_fwd_flops(inp, w.sequence_tokens))


def critic_flops(inp: PlanInputs, recompute: str) -> dict:
    """PPO's critic (zeros without one): `values` one forward over every sample (the old values),
    `train` forward and backward over every minibatch of every pass, `recompute_extra` at `recompute`
    (the critic's: critic.recompute or the layout's)."""
    if inp.critic is None:
        return {"values": 0.0, "train": 0.0, "recompute_extra": 0.0, "total": 0.0}
    c, w = critic_view(inp), inp.work
    mm = matmul_params_of(c.spec, VALUE)
    per_seq = 6.0 * mm * w.sequence_tokens + 3.0 * attention_fwd_flops(c, w.sequence_tokens)
    out = {
        "values": forward_flops(c, VALUE),
        "train": w.critic_epochs * (w.samples * per_seq),
        "recompute_extra": recompute_extra_flops(c, recompute),
    }
    out["total"] = out["values"] + out["train"] + out["recompute_extra"]
    return out


def reward_model_flops(inp: PlanInputs) -> float:
    """A learned reward model's forward over every sequence (prompt + completion); 0 without one."""
    return forward_flops(reward_view(inp), SCORE) if inp.reward_model is not None else 0.0


def logprob_forward_flops(inp: PlanInputs) -> dict:
    """Old-policy log-probs (the ratio's denominator, unless the update's own forward or the engines'
    log-probs stand in: algorithm.old_logprobs) and reference log-probs (when KL is on)."""
    w = inp.work
    one = w.samples * (
        2.0 * inp.matmul_params * w.sequence_tokens + attention_fwd_flops(inp, w.sequence_tokens)
    )
    old = one if w.old_forward else 0.0
    ref = one if w.reference_forward else 0.0
    return {"old": old, "ref": ref, "total": old + ref}


def model_flops(inp: PlanInputs, recompute: str, critic_recompute: str) -> dict:
    """Every model's FLOPs per step by what it runs (the models present): the policy's training (all
    passes), recompute and old-policy forward, the reference's forward, the critic's old values,
    training and recompute, the reward model's forward; each with its `total`."""
    lp = logprob_forward_flops(inp)
    policy = {
        "train": train_flops(inp),
        "recompute_extra": recompute_extra_flops(inp, recompute),
        "old_logprobs": lp["old"],
    }
    out = {"policy": policy | {"total": sum(policy.values())}}
    if inp.critic is not None:
        out["critic"] = critic_flops(inp, critic_recompute)
    if lp["ref"]:
        out["reference"] = {"forward": lp["ref"], "total": lp["ref"]}
    if inp.reward_model is not None:
        rm = reward_model_flops(inp)
        out["reward_model"] = {"forward": rm, "total": rm}
    return out


def prefill_flops_per_prompt(inp: PlanInputs) -> float:
    w = inp.work
    return 2.0 * inp.matmul_params * w.prompt_tokens + attention_fwd_flops(inp, w.prompt_tokens)


def prefill_flops(inp: PlanInputs, shared: bool) -> float:
    """Prefill of a step: once per prompt when the n samples share its KV prefix, else once per sample."""
    w = inp.work
    return (w.prompts if shared else w.samples) * prefill_flops_per_prompt(inp)


def decode_context_sum(prompt_tokens: int, completion_tokens: int) -> int:
    """Cached tokens read while decoding: token i (0-based) of the completion reads p + i of them."""
    c = completion_tokens
    return c * prompt_tokens + c * (c - 1) // 2


def decode_flops_per_sample(inp: PlanInputs, completion_tokens: int) -> float:
    """Compute of decoding one completion: 2·P per token plus attention over the cached context."""
    s = inp.spec
    ctx = decode_context_sum(inp.work.prompt_tokens, completion_tokens)
    return 2.0 * inp.matmul_params * completion_tokens + 4.0 * s.num_layers * s.q_size * ctx


def compute_seconds(inp: PlanInputs, flops: float, gpus: int = 1) -> float:
    """Wall seconds of `flops` spread evenly over `gpus` GPUs at the assumed MFU."""
    return flops / (gpus * inp.hw.peak_flops * inp.assume.train_mfu)
