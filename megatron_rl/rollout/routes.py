"""The experts a mixture-of-experts engine routed each token to, for routing replay in the trainer.

With `algorithm.routing_replay`, every sample carries `routes`: for each position the engine ran through
its layers (the prompt, then every generated token but the last, which is never fed back), the top-k
expert ids of every MoE layer, [positions, layers, k]. The trainer's forwards then use those experts
instead of choosing their own (trainer/replay.py), so a token near a routing tie is scored through the
experts that produced it.

Where the routes come from:
- GPU: vLLM's own capture (`enable_return_routed_experts`; `CompletionOutput.routed_experts`,
  [seq, layers, k]). It needs vLLM's Model Runner V2, which needs Triton: not on the CPU build.
- CPU: `RouteRecorder`, which wraps each MoE layer's `router.select_experts` (the call that returns the
  ids the fused-MoE kernel then uses) and files each step's ids under the request and position they
  belong to, read from the model runner's batch (`input_batch.req_ids`, `query_start_loc`, `positions`).
  Prefix caching is off there: a prompt block served from the cache is never routed again.
"""

from __future__ import annotations

import re

import torch

_LAYER = re.compile(r"(?:^|\.)layers\.(?P<i>\d+)\.mlp\.experts$")
UNSET = 255  # a position no layer has routed yet (expert ids fit in uint8 up to 255 experts)


def moe_layers(model: torch.nn.Module) -> dict[int, torch.nn.Module]:
    """Layer index -> the MoE module whose `router.select_experts` picks its experts (vLLM 0.32)."""
    out = {}
    for name, module in model.named_modules():
        m = _LAYER.search(name)
        if m and hasattr(getattr(module, "router", None), "select_experts"):
            out[int(m["i"])] = module
    return out


class RouteRecorder:
    """Records, per request and position, the experts vLLM's CPU engine routed each token to."""

    def __init__(self, runner, model: torch.nn.Module, num_layers: int, topk: int, max_len: int):
        self.runner, self.num_layers, self.topk, self.max_len = runner, num_layers, topk, max_len
        layers = moe_layers(model)
        if sorted(layers) != list(range(num_layers)):
            raise RuntimeError(
                f"routing replay: found MoE routers in layers {sorted(layers)} of a {num_layers}-layer model; "
                "this vLLM's Qwen3-MoE no longer exposes `mlp.experts.router.select_experts`"
            )
        self._routes: dict[str, torch.Tensor] = {}
        for i, module in layers.items():
            module.router.select_experts = self._wrap(module.router.select_experts, i)

    def _wrap(self, select, layer: int):
        def select_experts(*args, **kwargs):
            weights, ids = select(*args, **kwargs)
            self._file(layer, ids)
            return weights, ids

        return select_experts

    def _file(self, layer: int, ids: torch.Tensor) -> None:
        runner = self.runner
        n = runner.input_batch.num_reqs
        starts = runner.query_start_loc.cpu[: n + 1].tolist()
        positions = runner.positions[: starts[-1]].to("cpu")
        ids = ids[: starts[-1]].to("cpu", torch.uint8)
        for i, internal in enumerate(runner.input_batch.req_ids[:n]):
            buf = self._routes.get(internal.rsplit("-", 1)[0])  # vLLM suffixes the caller's request id
            if buf is not None:
                a, b = starts[i], starts[i + 1]
                buf[positions[a:b], layer] = ids[a:b]

    def begin(self, rid: str) -> None:
        """Start recording a request (call before it enters the engine)."""
        self._routes[rid] = torch.full((self.max_len, self.num_layers, self.topk), UNSET, dtype=torch.uint8)

    def take(self, rid: str, positions: int) -> torch.Tensor:
        """The routes of a finished request's first `positions` positions; refuses a gap."""
        buf = self._routes.pop(rid)[:positions].clone()
        missing = (buf == UNSET).any(-1).any(-1)
        if bool(missing.any()):
            raise RuntimeError(
                f"routing replay: request {rid} has no routes at positions "
                f"{torch.nonzero(missing).flatten()[:8].tolist()} (a prompt served from the prefix cache?)"
            )
        return buf

    def drop(self, rid: str) -> None:
        self._routes.pop(rid, None)


def check_routes(routes: torch.Tensor, positions: int, num_layers: int, topk: int, where: str) -> None:
    """Refuse routes of the wrong shape: one [layers, k] row per position the engine fed."""
    if tuple(routes.shape) != (positions, num_layers, topk):
        raise ValueError(
            f"{where}: routes of shape {list(routes.shape)}, expected [{positions}, {num_layers}, {topk}] "
            "(prompt + completion - 1 positions)"
        )


class EngineRoutes:
    """An engine's side of routing replay: the engine arguments it needs, and each finished request's
    routes (vLLM's own on GPU, the recorder's on CPU)."""

    def __init__(self, model_dir_config: dict, on_gpu: bool, max_len: int):
        self.on_gpu = on_gpu
        self.num_layers = int(model_dir_config["num_hidden_layers"])
        self.topk = int(model_dir_config["num_experts_per_tok"])
        self.max_len = max_len
        self.recorder: RouteRecorder | None = None

    def engine_kwargs(self) -> dict:
        if self.on_gpu:
            return {"enable_return_routed_experts": True}
        return {"enable_prefix_caching": False}  # every prompt position must be routed (module docstring)

    def attach(self, runner, model) -> None:
        """CPU: wrap the built engine's routers (GPU: vLLM captures them itself)."""
        if not self.on_gpu:
            self.recorder = RouteRecorder(runner, model, self.num_layers, self.topk, self.max_len)

    def begin(self, rid: str) -> None:
        if self.recorder is not None:
            self.recorder.begin(rid)

    def drop(self, rid: str) -> None:
        if self.recorder is not None:
            self.recorder.drop(rid)

    def finished(self, out, rid: str, positions: int) -> torch.Tensor:
        """The routes of a finished request: [positions, layers, k] uint8."""
        if self.recorder is not None:
            return self.recorder.take(rid, positions)
        got = getattr(out.outputs[0], "routed_experts", None)
        if got is None:
            raise RuntimeError(f"routing replay: vLLM returned no routed experts for request {rid}")
        routes = torch.as_tensor(got)[:positions].to(torch.uint8)
        check_routes(routes, positions, self.num_layers, self.topk, f"request {rid}")
        return routes
