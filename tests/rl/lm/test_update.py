"""rl.lm.update on a toy policy (logits = features @ w, no LM): the fused old log-probs give the update a separate
old pass gives; the sampler's log-probs as the old policy's; loss_mask removes tokens from the loss; custom
minibatch draws; config errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.lm import Rollout, UpdateConfig, lm_optimizer, make_update

B, N, V, D = 6, 4, 5, 3
FEATS = jax.random.normal(jax.random.key(0), (B, N, D))
TOKENS = jax.random.randint(jax.random.key(1), (B, N), 0, V)


def logp_fn(w, rows: Rollout):
    """rows.seqs holds the row index (column 0): log softmax(feats @ w) of the row's tokens, and the entropy."""
    i = rows.seqs[:, 0]
    lp = jax.nn.log_softmax(FEATS[i] @ w, -1)
    return jnp.take_along_axis(lp, TOKENS[i][..., None], -1)[..., 0], -(jnp.exp(lp) * lp).sum(-1)


def rollout(**kw):
    mask = (jnp.arange(N)[None] < jnp.array([4, 3, 2, 4, 1, 4])[:, None]).astype(jnp.float32)
    return Rollout(jnp.arange(B)[:, None], jnp.zeros(B, jnp.int32), mask, jnp.array([1.0, -1, 0.5, -0.5, 2, -2]), **kw)


W0 = jax.random.normal(jax.random.key(2), (D, V))
TX = lm_optimizer(1e-2)


def run(cfg: UpdateConfig, loss=LossConfig(), **kw):
    return make_update(logp_fn, make_loss(loss), TX, cfg, **{k: v for k, v in kw.items() if k == "batches"})(
        W0, TX.init(W0), rollout(**{k: v for k, v in kw.items() if k != "batches"}), jax.random.key(3))


def test_fused_old_logprobs_equal_a_separate_pass():
    (w_f, _), m_f = run(UpdateConfig())
    old, ent = logp_fn(W0, rollout())
    (w_r, _), m_r = run(UpdateConfig(old_logp="recompute"), old_logp=old, old_entropy=ent)
    (w_i, _), _ = run(UpdateConfig(old_logp="recompute"))  # the pass inside the update
    np.testing.assert_allclose(w_f, w_r, atol=1e-6) and np.testing.assert_allclose(w_i, w_r, atol=1e-6)
    assert float(m_f["ratio"].mean()) == 1.0  # exactly: the loss forward's own values
    np.testing.assert_allclose(m_f["sample_entropy"], m_r["sample_entropy"], rtol=1e-6)
    # the sampler's log-probs are compared with the old ones when given
    (_, _), m = run(UpdateConfig(), sample_logp=old + 1e-3 * rollout().mask)
    np.testing.assert_allclose(m["logp_mismatch"], 1e-3, rtol=1e-3)


def test_sampler_old_logprobs_and_loss_mask():
    old, _ = logp_fn(W0, rollout())
    (w_s, _), m = run(UpdateConfig(old_logp="sampler"), sample_logp=old - 0.1)
    assert float(m["ratio"].mean()) == pytest.approx(np.exp(0.1), rel=1e-5)
    with pytest.raises(ValueError, match="needs rollout.sample_logp"):
        run(UpdateConfig(old_logp="sampler"))
    # a loss mask removing row 0's tokens == row 0 inactive
    lm = jnp.ones((B, N)).at[0].set(0.0)
    (w_lm, _), _ = run(UpdateConfig(), loss_mask=lm)
    m0 = rollout().mask.at[0].set(0.0)
    (w_m, _), _ = make_update(logp_fn, make_loss(LossConfig()), TX)(W0, TX.init(W0), rollout().replace(mask=m0),
                                                                     jax.random.key(3))
    np.testing.assert_allclose(w_lm, w_m, atol=1e-7)


def test_several_minibatches_and_custom_batches():
    (_, _), m = run(UpdateConfig(epochs=2, minibatches=3))
    assert m["loss"].shape == (2, 3) and np.isfinite(float(m["logp_mismatch"] if "logp_mismatch" in m else 0))
    draws = lambda key, rows: jnp.array([[0, 1], [2, 2], [5, 4]])
    (_, _), m = run(UpdateConfig(), batches=draws)
    assert m["loss"].shape == (3,) and "sample_entropy" in m  # never fused with custom batches: an old pass
    with pytest.raises(ValueError, match="old_logp must be one of"):
        UpdateConfig(old_logp="stale")
    with pytest.raises(ValueError, match="b2"):
        lm_optimizer(1e-3, b2=1.0)
