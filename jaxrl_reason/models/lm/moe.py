"""DeepSeekMoE: shared experts + fine-grained routed experts with auxiliary-loss-free balancing.

Routing (per token): scores s = sigmoid(x W_g) (or softmax); selection uses s + b, where b is the
per-expert bias (an `ExpertBias` variable, never differentiated), optionally limited to the
`moe_topk_groups` best expert groups (group score = sum of its top-2 biased scores); gate weights
come from the *unbiased* scores of the selected experts, normalised to sum 1 (if `moe_norm_topk`)
and multiplied by `moe_route_scale`. The bias is updated outside the gradient by
`update_expert_bias`: b_i -= gamma * sign(load_i - mean load).

Dispatch is GShard-style with one group per sequence: a one-hot dispatch tensor [B, T, E, C]
moves tokens to [E, B, C, D] expert buffers, the expert SwiGLUs are batched einsums over E, and a
combine tensor brings them back. Capacity C = T (dropless: a token picks an expert at most once)
unless `moe_capacity_factor` is set, in which case assignments past slot C of an expert are dropped.
Expert parallelism (`LMConfig.moe_dispatch`), active under a mesh (``jax.set_mesh``) whose "expert"
axis has size n > 1 (expert weights are sharded over it by sharding.py; the batch is split over it
too, see ``BATCH_AXES``):
  "all_to_all" (default): explicit. The expert FFN runs in a ``jax.shard_map`` that is manual over
    "expert" only (data/fsdp/tensor stay automatic): each expert shard holds [E, B/n, C, D] buffers
    of its own sequences, one ``lax.all_to_all`` sends each expert's slice to the shard that owns
    it ([E/n, B, C, D]), the local experts run, and a second all-to-all returns the outputs.
    Needs E % n == 0 and B % n == 0; otherwise it falls back to "constraint" (documented, tested).
  "constraint": the expert buffers are constrained to P("expert", batch axes) and XLA's SPMD
    partitioner chooses the collectives.
Both are tested to equal the single-device result. Without a mesh both are the same computation.
With `cfg.fp8` the routed-expert GEMMs are FP8 too (``fp8_matmul`` vmapped over experts).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from jax.sharding import PartitionSpec as P

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.fp8 import fp8_matmul
from jaxrl_reason.models.lm.layers import SwiGLU
from jaxrl_reason.models.lm.sharding import constrain


class ExpertBias(nnx.Variable):
    """Per-expert routing bias [E]: not a Param, so optimisers never touch it."""


def route(scores: jax.Array, bias: jax.Array, cfg: LMConfig) -> tuple[jax.Array, jax.Array]:
    """scores [..., E] (unbiased), bias [E] -> (expert ids [..., k] int32, gate weights [..., k])."""
    e, g = cfg.n_routed_experts, cfg.moe_n_groups
    choice = scores + jax.lax.stop_gradient(bias)
    if g > 1 and cfg.moe_topk_groups < g:
        grouped = choice.reshape(*choice.shape[:-1], g, e // g)
        top2 = jax.lax.top_k(grouped, min(2, e // g))[0].sum(-1)  # [..., G]
        _, keep = jax.lax.top_k(top2, cfg.moe_topk_groups)
        gmask = jnp.sum(jax.nn.one_hot(keep, g, dtype=bool), axis=-2)  # [..., G]
        choice = jnp.where(jnp.repeat(gmask, e // g, axis=-1), choice, -jnp.inf)
    _, idx = jax.lax.top_k(choice, cfg.moe_top_k)
    w = jnp.take_along_axis(scores, idx, axis=-1)
    if cfg.moe_norm_topk:
        w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
    return idx, w * cfg.moe_route_scale


class MoE(nnx.Module):
    """x [B, T, D] -> (y [B, T, D], aux {"load": [E] fraction of assignments, "balance_loss": []})."""

    def __init__(self, cfg: LMConfig, *, rngs: nnx.Rngs):
        e, d, f = cfg.n_routed_experts, cfg.d_model, cfg.moe_d_ff
        init = jax.nn.initializers.normal(cfg.init_std)
        self.router = nnx.Param(init(rngs.params(), (d, e), jnp.float32))
        self.bias = ExpertBias(jnp.zeros((e,), jnp.float32))
        self.w_gate = nnx.Param(init(rngs.params(), (e, d, f), cfg.jparam_dtype))
        self.w_up = nnx.Param(init(rngs.params(), (e, d, f), cfg.jparam_dtype))
        self.w_down = nnx.Param(init(rngs.params(), (e, f, d), cfg.jparam_dtype))
        self.shared = SwiGLU(d, f * cfg.n_shared_experts, cfg, rngs=rngs) if cfg.n_shared_experts else None
        self.cfg = cfg

    def __call__(self, x: jax.Array):
        cfg, dt = self.cfg, self.cfg.jdtype
        b, t, d = x.shape
        e, k = cfg.n_routed_experts, cfg.moe_top_k
        logits = jnp.dot(x.astype(jnp.float32), self.router[...])
        scores = jax.nn.sigmoid(logits) if cfg.moe_score == "sigmoid" else jax.nn.softmax(logits, axis=-1)
        idx, w = route(scores, self.bias[...], cfg)  # [B, T, k]
        cap = t if cfg.moe_capacity_factor is None else min(t, math.ceil(cfg.moe_capacity_factor * t * k / e))
        sel = jax.nn.one_hot(idx, e, dtype=jnp.int32)  # [B, T, k, E]
        flat = sel.reshape(b, t * k, e)
        slot = jnp.sum((jnp.cumsum(flat, axis=1) - 1) * flat, axis=-1).reshape(b, t, k)  # slot in expert
        keep = slot < cap
        disp_k = sel.astype(dt)[..., None] * jax.nn.one_hot(jnp.where(keep, slot, cap), cap, dtype=dt)[:, :, :, None, :]
        dispatch = disp_k.sum(2)  # [B, T, E, C]
        combine = jnp.einsum("btkec,btk->btec", disp_k, w.astype(dt))
        xe = jnp.einsum("btec,btd->ebcd", dispatch, x.astype(dt))
        ye = self.experts(xe)
        y = jnp.einsum("btec,ebcd->btd", combine, ye)
        if self.shared is not None:
            y = y + self.shared(x)
        counts = sel.sum((0, 1, 2)).astype(jnp.float32)  # [E]
        load = counts / (b * t * k)
        # sequence-wise balance loss (DeepSeek-V3 eq. 17-20), averaged over sequences
        f_i = sel.sum((1, 2)).astype(jnp.float32) * e / (k * t)  # [B, E]
        p_i = jnp.mean(scores / jnp.sum(scores, -1, keepdims=True), axis=1)  # [B, E]
        balance = cfg.moe_seq_aux_alpha * jnp.mean(jnp.sum(f_i * p_i, -1))
        return y.astype(dt), {"load": load, "balance_loss": balance}


    def experts(self, xe: jax.Array) -> jax.Array:
        """Routed expert SwiGLUs on dispatched buffers: xe [E, B, C, D] -> [E, B, C, D] (see module doc)."""
        cfg, dt = self.cfg, self.cfg.jdtype
        ws = tuple(w[...].astype(dt) for w in (self.w_gate, self.w_up, self.w_down))
        ffn = functools.partial(_expert_ffn, fp8_block=cfg.fp8_block if cfg.fp8 else 0)
        mesh = jax.sharding.get_abstract_mesh()
        n = 1 if mesh.empty else dict(mesh.shape).get("expert", 1)
        e, b = xe.shape[:2]
        if n > 1 and cfg.moe_dispatch == "all_to_all" and e % n == 0 and b % n == 0:
            return _expert_parallel(ffn)(xe, *ws)
        spec = ("expert", ("data", "fsdp"), None, None)
        return constrain(ffn(constrain(xe, spec), *ws), spec)


def _expert_ffn(xe, w_gate, w_up, w_down, fp8_block: int = 0):
    """xe [E, B, C, D], w_gate/w_up [E, D, F], w_down [E, F, D] -> [E, B, C, D] (FP8 if fp8_block)."""
    if fp8_block:
        e, b, c, d = xe.shape
        mm = jax.vmap(lambda a, w: fp8_matmul(a.reshape(b * c, -1), w, fp8_block).reshape(b, c, -1))
        h = jax.nn.silu(mm(xe, w_gate).astype(xe.dtype)) * mm(xe, w_up).astype(xe.dtype)
        return mm(h, w_down).astype(xe.dtype)
    h = jax.nn.silu(jnp.einsum("ebcd,edf->ebcf", xe, w_gate)) * jnp.einsum("ebcd,edf->ebcf", xe, w_up)
    return jnp.einsum("ebcf,efd->ebcd", h, w_down)


def _expert_parallel(ffn):
    """shard_map over the "expert" axis: all-to-all tokens to their experts' shard and back."""

    def local(xe, w_gate, w_up, w_down):  # xe [E, B/n, C, D] (own sequences), w_* [E/n, ...] (own experts)
        xe = jax.lax.all_to_all(xe, "expert", split_axis=0, concat_axis=1, tiled=True)  # [E/n, B, C, D]
        ye = ffn(xe, w_gate, w_up, w_down)
        return jax.lax.all_to_all(ye, "expert", split_axis=1, concat_axis=0, tiled=True)  # [E, B/n, C, D]

    w = P("expert")
    return jax.shard_map(local, in_specs=(P(None, "expert"), w, w, w), out_specs=P(None, "expert"), axis_names={"expert"})


def update_expert_bias(bias: jax.Array, load: jax.Array, rate: float) -> jax.Array:
    """Aux-loss-free update: bias [..., E], load [..., E] -> bias - rate * sign(load - mean load)."""
    return bias - rate * jnp.sign(load - jnp.mean(load, axis=-1, keepdims=True))


def max_over_mean_load(load: jax.Array) -> jax.Array:
    """load [..., E] -> max_i load_i / mean load (1 = perfectly balanced)."""
    return jnp.max(load, -1) / jnp.mean(load, -1)
