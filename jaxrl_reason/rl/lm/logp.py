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
"""

from __future__ import annotations

import dataclasses

import jax
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


__all__ = ["REMAT", "check_remat", "lm_logp_fn", "remat_graphdef"]
