"""Response log-probs of a policy LM for the learner, with the rematerialisation of its forward pass a choice.

    logp_fn = lm_logp_fn(graphdef, n, temperature, chunk=64, remat="none")
    logp, entropy = logp_fn(params, rest, rows)         # rows: a Rollout; [B, n] each, float32

``remat`` (what the loss's backward pass keeps of the forward):
    "none"   every activation (fastest, most memory)
    "block"  only each transformer block's input; the block is recomputed in the backward pass
             (``LMConfig.remat``: the graphdef is the model's with ``cfg.remat = True``)
    "dots"   the matmul outputs of the whole forward (``jax.checkpoint_policies.dots_saveable``): norms,
             activations and softmaxes are recomputed, no matmul is
The LM head always runs ``chunk`` positions at a time under remat (``train.chunked_logprobs_entropy``).
LoRA dropout: ``rows.extra["dropout_seed"]`` [B] (the first row's seed is the minibatch's).

``trainable_rows_only(logp_fn, rows_per_pass)`` wraps a ``logp_fn`` so that rows with no trained token cost
nothing (multi-turn rollouts whose turn slots are mostly padding after an episode ended).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.models.lm.lora import set_dropout
from jaxrl_reason.models.lm.sequences import response_logprobs

REMAT = ("none", "block", "dots")


def check_remat(remat: str, where: str = "remat"):
    if remat not in REMAT:
        raise ValueError(f"{where} must be one of {REMAT}, got {remat!r}")


def remat_graphdef(graphdef, *states, remat: str = "none"):
    """The graphdef the loss's forward runs: ``graphdef`` itself, or (``"block"``) the same model with
    ``cfg.remat = True`` (``states``: the model's state(s), only to rebuild it; no array is copied)."""
    check_remat(remat)
    if remat != "block":
        return graphdef
    model = nnx.merge(graphdef, *states)
    model.cfg = dataclasses.replace(model.cfg, remat=True)
    return nnx.graphdef(model)


def lm_logp_fn(graphdef, n: int, temperature: float, chunk: int = 64, remat: str = "none", group: int = 1):
    """-> ``logp_fn(params, rest, rows) -> (logp [B, n], entropy [B, n])`` (see the module docstring);
    ``graphdef``: from ``remat_graphdef`` for ``"block"``. ``group`` > 1: rows come in groups of ``group``
    consecutive rows with one prompt, which runs once per group (``sequences.response_logprobs``; the update
    must keep groups whole: ``UpdateConfig(group=...)``)."""
    check_remat(remat)

    def logp(params, rest, seqs, plens, seed):
        model = nnx.merge(graphdef, params, rest)
        if seed is not None:  # LoRA dropout, in the loss's forward passes only
            set_dropout(model, jax.random.key(seed))
        return response_logprobs(model, seqs, plens, n, temperature, chunk, group)

    if remat == "dots":
        logp = jax.checkpoint(logp, policy=jax.checkpoint_policies.dots_saveable, static_argnums=())

    def logp_fn(params, rest, rows):
        seed = rows.extra.get("dropout_seed")
        return logp(params, rest, rows.seqs, rows.prompt_lens, None if seed is None else seed[0])

    return logp_fn


def trainable_rows_only(logp_fn, rows_per_pass: int):
    """``logp_fn(params, rest, rows) -> (logp, entropy)`` run over chunks of ``rows_per_pass`` rows, the rows with
    a trained token first (a stable sort); a chunk without one is not run (``lax.cond``, in the backward pass too)
    and gives log-probs and entropies 0, which the loss masks out. Same values as ``logp_fn`` on the trained rows;
    the cost is that of the trained rows rounded up to a chunk (plus one forward pass of them in the backward)."""

    def fn(params, rest, rows):
        r = len(rows)
        c = -(-r // rows_per_pass)
        live = rows.token_mask.sum(-1) > 0
        order = jnp.argsort(~live, stable=True)
        pad = c * rows_per_pass - r  # the last chunk's missing rows: row order[0] again, never marked live
        idx = jnp.concatenate([order, jnp.full((pad,), order[0])]).reshape(c, rows_per_pass)
        on = jnp.concatenate([live[order], jnp.zeros((pad,), bool)]).reshape(c, rows_per_pass).any(1)
        chunks = rows.take(idx)
        shapes = jax.eval_shape(lambda x: logp_fn(params, rest, x), jax.tree.map(lambda x: x[0], chunks))
        zeros = lambda: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        # each chunk under jax.checkpoint: its forward runs again in the backward pass, but the scan then keeps
        # only the chunk's rows per iteration, not the cond's residuals (a copy of the weights per chunk)
        body = jax.checkpoint(lambda p, a: jax.lax.cond(a[1], lambda: logp_fn(p, rest, a[0]), zeros))
        out = jax.lax.map(lambda a: body(params, a), (chunks, on))
        back = jnp.argsort(order)  # row i sits at sorted position back[i]
        return jax.tree.map(lambda x: x.reshape((c * rows_per_pass,) + x.shape[2:])[back], out)

    return fn


__all__ = ["REMAT", "check_remat", "lm_logp_fn", "remat_graphdef", "trainable_rows_only"]
