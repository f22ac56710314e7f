"""LLM intent policy with a consensus step, on the project's decoder LM (``models/lm``) and a
tokenizer handed in (``models/tokenizer/``; the presets use ``ByteTokenizer()``).

Text rendering: each UAV's local observation becomes a short ASCII prompt, built directly
as ids of that tokenizer inside jit (so the whole policy is jittable), e.g.::

    <bos>A1 E7 T0v3829 T1-0000 T2v6411 ?

(``A`` active flag; ``E`` distance digit to the nearest visible pursuer, 9 = none; per target
``T<j>`` visible (v/-), then digits for distance, urgency, served, coverage). The answer is one
letter ``chr(ord('a') + action)`` naming (target, role) = (a // 3, a % 3). Stage 1 (``propose``)
reads the next-token distribution after ``?`` restricted to the action letters. Stage 2
(``revise``, consensus) appends the neighbours' proposals as letters (``-`` = no
neighbour) and the own proposal: ``... ?c N:ch- ?`` and reads the revised letter.

``train_llm_policy`` fine-tunes a small LM by SFT on traces of the scripted prior (both
stages; ``sft_loss`` masks everything but the two answer letters).

The tokenizer must spell the digits and the letters ``a``-``z`` as single tokens (a byte or character
tokenizer); the policy keeps it (``LLMIntentPolicy.tokenizer``), and every rendering function takes it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from jaxrl_reason.agents.rally.intent import RulePrior, act, decode
from jaxrl_reason.envs.swarm import Swarm
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sft import fit
from jaxrl_reason.models.tokenizer import Tokenizer

MAX_ACTIONS = 26  # one answer letter per action: 'a'..'z'


class _CharIds(NamedTuple):
    digits: tuple[int, ...]  # ids of '0'..'9'
    letters: tuple[int, ...]  # ids of 'a'..'z'


@functools.lru_cache(maxsize=16)
def _char_ids(tokenizer: Tokenizer) -> _CharIds:
    """The single-token ids of the digits and answer letters (static; once per tokenizer)."""

    try:
        digits, letters = tokenizer.spell("0123456789"), tokenizer.spell("".join(chr(ord("a") + i) for i in range(MAX_ACTIONS)))
    except ValueError as e:
        raise ValueError(f"RALLY's LLM prompts need digits and action letters as single tokens: {e}") from None
    return _CharIds(tuple(digits), tuple(letters))


def _ids(text: str, tokenizer: Tokenizer) -> jax.Array:
    return jnp.asarray(tokenizer.encode(text), jnp.int32)


def _digit(x, lo: float, hi: float, tokenizer: Tokenizer) -> jax.Array:
    """Quantise to one ASCII digit token ``'0'..'9'``."""
    q = jnp.clip(jnp.round((x - lo) / (hi - lo) * 9.0), 0, 9).astype(jnp.int32)
    return jnp.asarray(_char_ids(tokenizer).digits, jnp.int32)[q]


def _letter(action: jax.Array, tokenizer: Tokenizer) -> jax.Array:
    """Action index -> the id of its answer letter ``chr(ord('a') + action)``."""
    return jnp.asarray(_char_ids(tokenizer).letters, jnp.int32)[jnp.asarray(action, jnp.int32)]


def letter_action(ids: jax.Array, tokenizer: Tokenizer) -> jax.Array:
    """Answer-letter ids -> action indices (the inverse of the letter rendering; 0 for a non-letter id)."""
    letters = jnp.asarray(_char_ids(tokenizer).letters, jnp.int32)
    return jnp.argmax(ids[..., None] == letters, -1).astype(jnp.int32)


def render_prompt(env: Swarm, obs: jax.Array, tokenizer: Tokenizer) -> jax.Array:
    """Stage-1 prompt ids ``[A, P]`` (fixed length) for observations ``[A, obs_dim]``."""
    v = decode(env, obs)
    A, M = v.urgency.shape
    tok = lambda s: jnp.broadcast_to(_ids(s, tokenizer), (A, len(tokenizer.encode(s))))
    digit = functools.partial(_digit, tokenizer=tokenizer)
    parts = [jnp.full((A, 1), tokenizer.bos_id, jnp.int32), tok("A"), digit(v.active, 0, 1)[:, None],
             tok(" E"), digit(jnp.minimum(v.threat_dist, 1.0), 0, 1)[:, None]]
    vis_tok = jnp.where(v.target_visible, _ids("v", tokenizer)[0], _ids("-", tokenizer)[0])
    dist = jnp.where(v.target_visible, v.target_dist, 0.0)
    for j in range(M):
        parts += [tok(f" T{j}"), vis_tok[:, j:j + 1], digit(dist[:, j:j + 1], 0, 1.2),
                  digit(v.urgency[:, j:j + 1], 0, 1), digit(v.served[:, j:j + 1], 0, 1),
                  digit(v.coverage[:, j:j + 1], 0, 1)]
    parts.append(tok(" ?"))
    return jnp.concatenate(parts, -1)


def render_consensus(prompt: jax.Array, proposals: jax.Array, neighbors: jax.Array, tokenizer: Tokenizer) -> jax.Array:
    """Stage-2 prompt ``[A, P + k + 5]``: stage-1 prompt, own proposal, neighbours' proposals."""
    A = prompt.shape[0]
    tok = lambda s: jnp.broadcast_to(_ids(s, tokenizer), (A, len(tokenizer.encode(s))))
    nb = jnp.where(neighbors >= 0, _letter(proposals[jnp.maximum(neighbors, 0)], tokenizer), _ids("-", tokenizer)[0])
    return jnp.concatenate([prompt, _letter(proposals, tokenizer)[:, None], tok(" N:"), nb, tok(" ?")], -1)


def to_text(ids: jax.Array, tokenizer: Tokenizer) -> list[str]:
    """Rendered prompts as strings (for display)."""
    return tokenizer.decode_batch(np.asarray(ids), skip_special=True)


def default_lm_config(tokenizer: Tokenizer, max_seq_len: int = 128) -> LMConfig:
    return LMConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                    max_seq_len=max_seq_len)


@struct.dataclass
class LLMIntentPolicy:
    """Intent policy (same interface as ``RulePrior``) read off an LM's next-letter distribution."""

    env: Swarm = struct.field(pytree_node=False)
    graphdef: object = struct.field(pytree_node=False)
    params: object = None
    greedy: bool = struct.field(pytree_node=False, default=True)
    tokenizer: Tokenizer = struct.field(pytree_node=False, default=None)  # required: the LM's tokenizer

    def __post_init__(self):
        if not isinstance(self.tokenizer, Tokenizer):
            raise TypeError(f"LLMIntentPolicy needs its LM's tokenizer (tokenizer=...), got {self.tokenizer!r}")
        if self.env.num_actions > MAX_ACTIONS:
            raise ValueError(f"the letter answer format supports at most {MAX_ACTIONS} actions, got {self.env.num_actions}")

    def action_logits(self, ids: jax.Array) -> jax.Array:
        """``[A, L]`` prompt ids -> ``[A, num_actions]`` logits of the answer letter."""
        logits, _, _ = nnx.merge(self.graphdef, self.params)(ids)
        letters = _letter(jnp.arange(self.env.num_actions), self.tokenizer)
        return logits[:, -1, letters]

    def _choose(self, key, logits):
        return (jnp.argmax(logits, -1) if self.greedy else jax.random.categorical(key, logits)).astype(jnp.int32)

    def propose(self, key, obs):
        return self._choose(key, self.action_logits(render_prompt(self.env, obs, self.tokenizer)))

    def revise(self, key, obs, proposals, neighbors):
        ids = render_consensus(render_prompt(self.env, obs, self.tokenizer), proposals, neighbors, self.tokenizer)
        return self._choose(key, self.action_logits(ids))


def prior_traces(env: Swarm, prior: RulePrior, key: jax.Array, num_envs: int, steps: int, *,
                 tokenizer: Tokenizer) -> jax.Array:
    """Token sequences ``[num_envs * steps * A, L]`` (ids of ``tokenizer``) of the prior's two stages
    (answers included)."""
    from jaxrl_reason import envs as envs_mod

    wrapped = envs_mod.AutoReset(env)

    def body(carry, key):
        state, ts = carry
        k1, k2, k3 = jax.random.split(key, 3)

        def one(key, ts):
            ka, kb = jax.random.split(key)
            prop = prior.propose(ka, ts.obs)
            final = prior.revise(kb, ts.obs, prop, ts.info["neighbors"])
            seq = render_consensus(render_prompt(env, ts.obs, tokenizer), prop, ts.info["neighbors"], tokenizer)
            return jnp.concatenate([seq, _letter(final, tokenizer)[:, None]], -1), final

        seqs, action = jax.vmap(one)(jax.random.split(k1, num_envs), ts)
        state, ts = jax.vmap(wrapped.step)(jax.random.split(k2, num_envs), state, action)
        return (state, ts), seqs

    state, ts = jax.vmap(wrapped.reset)(jax.random.split(key, num_envs))
    _, seqs = jax.lax.scan(body, (state, ts), jax.random.split(jax.random.fold_in(key, 1), steps))
    return seqs.reshape(-1, seqs.shape[-1])


def train_llm_policy(env: Swarm, prior: RulePrior, key: jax.Array, *, tokenizer: Tokenizer, sft_steps: int = 200,
                     batch: int = 64, lr: float = 3e-3, trace_envs: int = 16, trace_steps: int = 50, run_dir=None,
                     lm_config: LMConfig | None = None, model: Transformer | None = None) -> LLMIntentPolicy:
    """SFT of a small LM (its vocabulary: ``tokenizer``'s) on the prior's traces; returns the greedy LLM
    intent policy. ``model``: start from this LM (a pretrained checkpoint's, ``models.lm.load_model``, with its
    ``tokenizer``; trained in place) instead of a fresh one of ``lm_config``.

    The loss covers the two answer letters (the proposal right after the stage-1 ``?`` and
    the revised intention at the end)."""
    if env.num_actions > MAX_ACTIONS:
        raise ValueError(f"the letter answer format supports at most {MAX_ACTIONS} actions, got {env.num_actions}")
    k_model, k_trace, k_batch = jax.random.split(key, 3)
    seqs = jax.jit(functools.partial(prior_traces, env, prior, num_envs=trace_envs, steps=trace_steps,
                                     tokenizer=tokenizer))(k_trace)
    L = seqs.shape[1]
    p1 = render_prompt(env, jnp.zeros((1, *env.obs_shape)), tokenizer).shape[1]
    mask = np.zeros((L - 1,), np.float32)
    mask[p1 - 1] = 1.0  # predicts the proposal letter at position p1
    mask[L - 2] = 1.0  # predicts the final letter
    cfg = model.cfg if model is not None else lm_config or default_lm_config(tokenizer, max(128, L))
    tokenizer.check_model(cfg, L, "train_llm_policy")
    model = Transformer(cfg, rngs=nnx.Rngs(k_model)) if model is None else model

    def log(i, metrics):
        if run_dir is not None and (i % 10 == 0 or i == sft_steps - 1):
            run_dir.log(i, {"llm/sft_nll": metrics["nll"]})

    data = {"tokens": seqs, "loss_mask": jnp.broadcast_to(jnp.asarray(mask), (seqs.shape[0], L - 1))}
    fit(model, data, sft_steps, batch, lr, k_batch, chunk=128, name="RALLY LLM SFT", log=log)
    return LLMIntentPolicy(env, nnx.graphdef(model), nnx.state(model), tokenizer=tokenizer)


__all__ = ["LLMIntentPolicy", "act", "default_lm_config", "letter_action", "prior_traces", "render_consensus",
           "render_prompt", "to_text", "train_llm_policy"]
