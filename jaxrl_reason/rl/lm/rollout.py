"""``Rollout``: what every LM RL trainer hands the learner (``rl.lm.update``), one row per trained sequence.

    rollout = Rollout(seqs, prompt_lens, mask, advantages, sample_logp=out.logprobs)

Shapes: B rows, T = P + N tokens per row (``models.lm.sequences.join``: prompt, then the N response slots),
response tensors [B, N]. ``mask`` marks the response tokens of each row (its length, inactive rows all 0);
``loss_mask`` (optional) further removes tokens the model did not write (tool output, environment text)
from the loss. ``extra``: per-row arrays a trainer's log-prob function needs (a model index, dropout seeds).
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Rollout:
    seqs: jax.Array  # [B, T] int32: prompt + response (join)
    prompt_lens: jax.Array  # [B] int32
    mask: jax.Array  # [B, N] float32: 1 on each row's response tokens
    advantages: jax.Array | None = None  # [B] float32, one per sequence (None: from the rewards, by the learner)
    sample_logp: jax.Array | None = None  # [B, N] log-probs the sampler drew the tokens with
    ref_logp: jax.Array | None = None  # [B, N] reference log-probs (only with a KL term or KL metrics)
    old_logp: jax.Array | None = None  # [B, N] old-policy log-probs computed ahead (else: see UpdateConfig)
    old_entropy: jax.Array | None = None  # [B, N] entropy at the old policy (metrics only)
    loss_mask: jax.Array | None = None  # [B, N] 0 on tokens the model did not write
    extra: dict = flax.struct.field(default_factory=dict)  # {name: [B, ...]} for the log-prob function
    rewards: jax.Array | None = None  # [S] float32 per rewarded sample
    groups: jax.Array | None = None  # [S] int32 group of each sample (None: one group)
    valid: jax.Array | None = None  # [S] 1 / 0 (bool or float)
    sample: jax.Array | None = None  # [B] int32 the sample of each row (None: row i is sample i)
    num_groups: int = flax.struct.field(pytree_node=False, default=0)  # 0: S
    keep: int = flax.struct.field(pytree_node=False, default=0)  # groups trained on (0: all)

    def __len__(self) -> int:
        return self.seqs.shape[0]

    @property
    def token_mask(self) -> jax.Array:
        """[B, N] float32: the tokens trained on (mask x loss_mask)."""
        m = self.mask.astype(jnp.float32)
        return m if self.loss_mask is None else m * self.loss_mask.astype(jnp.float32)

    def take(self, idx: jax.Array) -> "Rollout":
        """The rows ``idx`` [...] (every [B, ...] field indexed; the [S] reward fields too when rows are samples)."""
        return jax.tree.map(lambda x: x[idx], self)

    def rows_only(self) -> "Rollout":
        """The row fields alone (the reward fields dropped): what the log-prob function and the update read."""
        return self.replace(rewards=None, groups=None, valid=None, sample=None)


__all__ = ["Rollout"]
