"""Training utilities: chunked token log-probs, masked SFT loss (+ MTP, + MoE balance loss), optax
optimiser with warmup-cosine schedule, and a jitted train step that also applies DeepSeek's
auxiliary-loss-free expert-bias update outside the gradient.

Chunking: the head is applied to `chunk` time steps at a time inside a `lax.scan` whose body is
rematerialised, so neither the forward nor the backward pass ever holds [B, T, V] logits; the peak
is [B, chunk, V].
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_reason.models.lm.moe import ExpertBias, update_expert_bias
from jaxrl_reason.utils.guard import guard_optimizer


def _chunked_head(model, h: jax.Array, targets: jax.Array, chunk: int, fn, head=None):
    """Apply the head (``head`` or ``model.logits``) to `chunk` steps at a time (rematerialised scan) and
    reduce each chunk's logits with fn(logits [B, c, V] f32, targets [B, c]) -> tuple of [B, c] arrays;
    returns [B, T] each."""
    head = model.logits if head is None else head
    b, t, d = h.shape
    c = min(chunk, t)
    pad = (-t) % c
    hp = jnp.pad(h, ((0, 0), (0, pad), (0, 0))).reshape(b, -1, c, d).swapaxes(0, 1)
    tp = jnp.pad(targets, ((0, 0), (0, pad))).reshape(b, -1, c).swapaxes(0, 1)

    @jax.checkpoint
    def one(hc, tc):
        return fn(head(hc), tc)

    _, outs = jax.lax.scan(lambda _, x: (None, one(*x)), None, (hp, tp))
    return tuple(o.swapaxes(0, 1).reshape(b, -1)[:, :t] for o in outs)


def chunked_logprobs(model, h: jax.Array, targets: jax.Array, chunk: int = 128, head=None) -> jax.Array:
    """h [B, T, D] (pre final norm), targets [B, T] -> log p(targets) [B, T] float32, chunked over T.
    ``head``: h [..., D] -> logits (default ``model.logits``; ``model.mtp_logits`` for MTP hiddens)."""

    def fn(logits, tc):
        return (jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0] - jax.nn.logsumexp(logits, axis=-1),)

    return _chunked_head(model, h, targets, chunk, fn, head)[0]


def chunked_logprobs_entropy(model, h: jax.Array, targets: jax.Array, chunk: int = 128, temperature: float = 1.0):
    """h [B, T, D], targets [B, T] -> (log pi(targets) [B, T], entropy H(pi) [B, T]), float32, where
    pi = softmax(logits / temperature) (the sampler's distribution without top-k/top-p). Chunked like
    `chunked_logprobs`: [B, T, V] logits are never all held, forward or backward."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    def fn(logits, tc):
        lp = jax.nn.log_softmax(logits / temperature, axis=-1)
        ent = -jnp.sum(jnp.exp(lp) * lp, axis=-1)
        return jnp.take_along_axis(lp, tc[..., None], axis=-1)[..., 0], ent

    return _chunked_head(model, h, targets, chunk, fn)


def token_logprobs(model, tokens: jax.Array, chunk: int = 128) -> jax.Array:
    """tokens [B, T] -> [B, T-1]: log p(tokens[:, t+1] | tokens[:, :t+1]) (what every RL loss needs)."""
    h, _, _ = model.hidden(tokens)
    return chunked_logprobs(model, h[:, :-1], tokens[:, 1:], chunk)


def token_logprobs_entropy(model, tokens: jax.Array, chunk: int = 128, temperature: float = 1.0):
    """tokens [B, T] -> (logp [B, T-1], entropy [B, T-1]) of next tokens under softmax(logits / temperature).

    With a sampler ``JoinedSample`` j: ``mask = j.completion_mask[:, 1:]`` selects the completion terms.
    """
    h, _, _ = model.hidden(tokens)
    return chunked_logprobs_entropy(model, h[:, :-1], tokens[:, 1:], chunk, temperature)


def _masked_mean(x, mask):
    mask = mask.astype(jnp.float32)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def sft_loss(model, tokens: jax.Array, loss_mask: jax.Array, chunk: int = 128):
    """Masked next-token NLL. tokens [B, T], loss_mask [B, T-1] (1 where target tokens[:, t+1] counts).

    Adds cfg.mtp_loss_weight * MTP NLL (targets tokens[:, t+2]) and the MoE sequence-wise balance
    loss when configured. Returns (loss, metrics dict; metrics["load"] is [L, E] for MoE models).
    """
    cfg = model.cfg
    h, _, aux = model.hidden(tokens)
    nll = _masked_mean(-chunked_logprobs(model, h[:, :-1], tokens[:, 1:], chunk), loss_mask)
    loss, metrics = nll, {"nll": nll}
    if cfg.mtp_depth:
        hm, aux_m = model.mtp_hidden(h, tokens)
        mtp_lp = chunked_logprobs(model, hm[:, :-1], tokens[:, 2:], chunk, model.mtp_logits)
        mtp_nll = _masked_mean(-mtp_lp, loss_mask[:, 1:])
        loss = loss + cfg.mtp_loss_weight * mtp_nll
        metrics["mtp_nll"] = mtp_nll
        if aux_m:
            loss = loss + aux_m["balance_loss"]
            metrics["mtp_load"] = aux_m["load"]
    if aux:
        loss = loss + aux["balance_loss"]
        metrics["load"], metrics["balance_loss"] = aux["load"], aux["balance_loss"]
    metrics["loss"] = loss
    return loss, metrics


def make_optimizer(
    lr: float, total_steps: int, warmup_steps: int = 0, weight_decay: float = 0.0, clip_norm: float = 1.0, b2: float = 0.95
) -> optax.GradientTransformation:
    """AdamW with linear warmup + cosine decay to 10% of `lr`, after global-norm clipping."""
    warmup = max(warmup_steps, 1)  # (a one-step run: one warmup step, then a one-step decay)
    sched = optax.warmup_cosine_decay_schedule(0.0, lr, warmup, max(total_steps, warmup + 1), lr * 0.1)
    return guard_optimizer(
        optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(sched, b2=b2, weight_decay=weight_decay))
    )


@flax.struct.dataclass
class TrainState:
    params: nnx.State  # trained leaves (nnx.Param, or LoRAParam adapters only)
    rest: nnx.State  # everything else (expert biases; frozen base weights under LoRA)
    opt_state: optax.OptState
    step: jax.Array


def init_train_state(model, optimizer: optax.GradientTransformation, wrt=nnx.Param):
    """-> (graphdef, TrainState). ``wrt``: the variables trained, e.g. ``lora.LoRAParam`` for LoRA
    adapters only (the base weights then ride frozen in ``rest``; no adapter dropout here)."""
    graphdef, params, rest = nnx.split(model, wrt, ...)
    return graphdef, TrainState(params=params, rest=rest, opt_state=optimizer.init(params), step=jnp.int32(0))


def apply_bias_update(model, metrics: dict) -> None:
    """In-place (on a merged, traced model) aux-loss-free update of every MoE expert bias."""
    rate = model.cfg.moe_bias_update_rate
    if not model.cfg.is_moe or rate == 0.0:
        return
    bias = model.blocks.mlp.bias
    bias[...] = update_expert_bias(bias[...], metrics["load"], rate)
    if model.mtp is not None:
        mb = model.mtp.block.mlp.bias
        mb[...] = update_expert_bias(mb[...], metrics["mtp_load"], rate)


def make_train_step(graphdef, optimizer: optax.GradientTransformation, chunk: int = 128, wrt=nnx.Param):
    """Jitted `step(state, batch) -> (state, metrics)`; batch = {"tokens": [B,T], "loss_mask": [B,T-1]}.
    ``wrt``: the filter the state was split with (`init_train_state`)."""

    def step(state: TrainState, batch: dict):
        def loss_fn(params):
            return sft_loss(nnx.merge(graphdef, params, state.rest), batch["tokens"], batch["loss_mask"], chunk)

        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        model = nnx.merge(graphdef, params, state.rest)
        apply_bias_update(model, metrics)
        _, _, rest = nnx.split(model, wrt, ...)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return TrainState(params=params, rest=rest, opt_state=opt_state, step=state.step + 1), metrics

    return jax.jit(step, donate_argnums=0)


__all__ = [
    "ExpertBias",
    "TrainState",
    "chunked_logprobs",
    "chunked_logprobs_entropy",
    "init_train_state",
    "make_optimizer",
    "make_train_step",
    "sft_loss",
    "token_logprobs",
    "token_logprobs_entropy",
]
