"""LLM intent policy with a consensus step, on the project's decoder LM (``models/lm``) and
byte tokenizer (``models/tokenizer.py``).

Text rendering: each UAV's local observation becomes a short ASCII prompt, built directly
as byte-tokenizer ids inside jit (so the whole policy is jittable), e.g.::

    <bos>A1 E7 T0v3829 T1-0000 T2v6411 ?

(``A`` active flag; ``E`` distance digit to the nearest visible pursuer, 9 = none; per target
``T<j>`` visible (v/-), then digits for distance, urgency, served, coverage). The answer is one
letter ``chr(ord('a') + action)`` naming (target, role) = (a // 3, a % 3). Stage 1 (``propose``)
reads the next-token distribution after ``?`` restricted to the action letters. Stage 2
(``revise``, consensus) appends the neighbours' proposals as letters (``-`` = no
neighbour) and the own proposal: ``... ?c N:ch- ?`` and reads the revised letter.

``train_llm_policy`` fine-tunes a small LM by SFT on traces of the scripted prior (both
stages; ``sft_loss`` masks everything but the two answer letters).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from jaxrl_reason.agents.rally.intent import RulePrior, act, decode
from jaxrl_reason.envs.swarm import Swarm
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm import train as lm_train
from jaxrl_reason.models.tokenizer import ByteTokenizer
from jaxrl_reason.utils.guard import check_trained

TOKENIZER = ByteTokenizer()


def _ids(text: str) -> jax.Array:
    return jnp.asarray(TOKENIZER.encode(text), jnp.int32)


def _digit(x, lo: float, hi: float) -> jax.Array:
    """Quantise to one ASCII digit token ``'0'..'9'``."""
    q = jnp.clip(jnp.round((x - lo) / (hi - lo) * 9.0), 0, 9).astype(jnp.int32)
    return q + TOKENIZER.n_special + ord("0")


def _letter(action: jax.Array) -> jax.Array:
    return action.astype(jnp.int32) + TOKENIZER.n_special + ord("a")


def render_prompt(env: Swarm, obs: jax.Array) -> jax.Array:
    """Stage-1 prompt ids ``[A, P]`` (fixed length) for observations ``[A, obs_dim]``."""
    v = decode(env, obs)
    A, M = v.urgency.shape
    tok = lambda s: jnp.broadcast_to(_ids(s), (A, len(TOKENIZER.encode(s))))
    parts = [jnp.full((A, 1), TOKENIZER.bos_id, jnp.int32), tok("A"), _digit(v.active, 0, 1)[:, None],
             tok(" E"), _digit(jnp.minimum(v.threat_dist, 1.0), 0, 1)[:, None]]
    vis_tok = jnp.where(v.target_visible, _ids("v")[0], _ids("-")[0])
    dist = jnp.where(v.target_visible, v.target_dist, 0.0)
    for j in range(M):
        parts += [tok(f" T{j}"), vis_tok[:, j:j + 1], _digit(dist[:, j:j + 1], 0, 1.2),
                  _digit(v.urgency[:, j:j + 1], 0, 1), _digit(v.served[:, j:j + 1], 0, 1),
                  _digit(v.coverage[:, j:j + 1], 0, 1)]
    parts.append(tok(" ?"))
    return jnp.concatenate(parts, -1)


def render_consensus(prompt: jax.Array, proposals: jax.Array, neighbors: jax.Array) -> jax.Array:
    """Stage-2 prompt ``[A, P + k + 5]``: stage-1 prompt, own proposal, neighbours' proposals."""
    A = prompt.shape[0]
    nb = jnp.where(neighbors >= 0, _letter(proposals[jnp.maximum(neighbors, 0)]), _ids("-")[0])
    return jnp.concatenate([prompt, _letter(proposals)[:, None], jnp.broadcast_to(_ids(" N:"), (A, 3)), nb,
                            jnp.broadcast_to(_ids(" ?"), (A, 2))], -1)


def to_text(ids: jax.Array) -> list[str]:
    """Rendered prompts as strings (for display)."""
    return TOKENIZER.decode_batch(np.asarray(ids), skip_special=True)


def default_lm_config(max_seq_len: int = 128) -> LMConfig:
    return LMConfig(vocab_size=TOKENIZER.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                    max_seq_len=max_seq_len)


@struct.dataclass
class LLMIntentPolicy:
    """Intent policy (same interface as ``RulePrior``) read off an LM's next-letter distribution."""

    env: Swarm = struct.field(pytree_node=False)
    graphdef: object = struct.field(pytree_node=False)
    params: object = None
    greedy: bool = struct.field(pytree_node=False, default=True)

    def action_logits(self, ids: jax.Array) -> jax.Array:
        """``[A, L]`` prompt ids -> ``[A, num_actions]`` logits of the answer letter."""
        logits, _, _ = nnx.merge(self.graphdef, self.params)(ids)
        letters = _letter(jnp.arange(self.env.num_actions))
        return logits[:, -1, letters]

    def _choose(self, key, logits):
        return (jnp.argmax(logits, -1) if self.greedy else jax.random.categorical(key, logits)).astype(jnp.int32)

    def propose(self, key, obs):
        return self._choose(key, self.action_logits(render_prompt(self.env, obs)))

    def revise(self, key, obs, proposals, neighbors):
        ids = render_consensus(render_prompt(self.env, obs), proposals, neighbors)
        return self._choose(key, self.action_logits(ids))


def prior_traces(env: Swarm, prior: RulePrior, key: jax.Array, num_envs: int, steps: int) -> jax.Array:
    """Token sequences ``[num_envs * steps * A, L]`` of the prior's two stages (answers included)."""
    from jaxrl_reason import envs as envs_mod

    wrapped = envs_mod.AutoReset(env)

    def body(carry, key):
        state, ts = carry
        k1, k2, k3 = jax.random.split(key, 3)

        def one(key, ts):
            ka, kb = jax.random.split(key)
            prop = prior.propose(ka, ts.obs)
            final = prior.revise(kb, ts.obs, prop, ts.info["neighbors"])
            seq = render_consensus(render_prompt(env, ts.obs), prop, ts.info["neighbors"])
            return jnp.concatenate([seq, _letter(final)[:, None]], -1), final

        seqs, action = jax.vmap(one)(jax.random.split(k1, num_envs), ts)
        state, ts = jax.vmap(wrapped.step)(jax.random.split(k2, num_envs), state, action)
        return (state, ts), seqs

    state, ts = jax.vmap(wrapped.reset)(jax.random.split(key, num_envs))
    _, seqs = jax.lax.scan(body, (state, ts), jax.random.split(jax.random.fold_in(key, 1), steps))
    return seqs.reshape(-1, seqs.shape[-1])


def train_llm_policy(env: Swarm, prior: RulePrior, key: jax.Array, *, sft_steps: int = 200, batch: int = 64,
                     lr: float = 3e-3, trace_envs: int = 16, trace_steps: int = 50, run_dir=None,
                     lm_config: LMConfig | None = None) -> LLMIntentPolicy:
    """SFT of a small LM on the prior's traces; returns the greedy LLM intent policy.

    The loss covers the two answer letters (the proposal right after the stage-1 ``?`` and
    the revised intention at the end)."""
    if env.num_actions > 26:
        raise ValueError(f"the letter answer format supports at most 26 actions, got {env.num_actions}")
    k_model, k_trace, k_batch = jax.random.split(key, 3)
    seqs = jax.jit(functools.partial(prior_traces, env, prior, num_envs=trace_envs, steps=trace_steps))(k_trace)
    L = seqs.shape[1]
    p1 = render_prompt(env, jnp.zeros((1, *env.obs_shape))).shape[1]
    mask = np.zeros((L - 1,), np.float32)
    mask[p1 - 1] = 1.0  # predicts the proposal letter at position p1
    mask[L - 2] = 1.0  # predicts the final letter
    cfg = lm_config or default_lm_config(max(128, L))
    model = Transformer(cfg, rngs=nnx.Rngs(k_model))
    optimizer = lm_train.make_optimizer(lr, sft_steps, warmup_steps=min(20, sft_steps // 10))
    graphdef, state = lm_train.init_train_state(model, optimizer)
    step = lm_train.make_train_step(graphdef, optimizer)
    loss_mask = jnp.broadcast_to(jnp.asarray(mask), (batch, L - 1))
    losses = []
    for i, k in enumerate(jax.random.split(k_batch, sft_steps)):
        idx = jax.random.randint(k, (batch,), 0, seqs.shape[0])
        state, metrics = step(state, {"tokens": seqs[idx], "loss_mask": loss_mask})
        losses.append(metrics["nll"])
        if run_dir is not None and (i % 10 == 0 or i == sft_steps - 1):
            run_dir.log(i, {"llm/sft_nll": metrics["nll"]})
    check_trained("RALLY LLM SFT", state, losses)
    params = nnx.state(nnx.merge(graphdef, state.params, state.rest))
    full_graphdef = nnx.graphdef(nnx.merge(graphdef, state.params, state.rest))
    return LLMIntentPolicy(env, full_graphdef, params)


__all__ = ["LLMIntentPolicy", "act", "prior_traces", "render_consensus", "render_prompt", "to_text",
           "train_llm_policy"]
