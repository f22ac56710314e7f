"""GRPO advantages and losses against hand-computed examples."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.rl.lm.advantages import (broadcast_advantages, dr_grpo_advantages, group_advantages,
                                             grpo_advantages, rloo_advantages, segment_advantages)
from jaxrl_reason.rl.lm.advantages import ESTIMATORS
from jaxrl_reason.rl.lm.loss import LossConfig, aggregate, grpo_loss, kl_estimate
from jaxrl_reason.rewards import Overlong

R = jnp.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])


def test_group_advantages_by_hand():
    np.testing.assert_allclose(grpo_advantages(R), [[1, -1, -1, 1], [0, 0, 0, 0]], atol=1e-5)
    np.testing.assert_allclose(dr_grpo_advantages(R), [[0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0]])
    # RLOO: r_i - mean of the other three: 1 - 1/3, 0 - 2/3
    np.testing.assert_allclose(rloo_advantages(R), [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [0, 0, 0, 0]], atol=1e-6)
    np.testing.assert_allclose(group_advantages(R, "rloo"), rloo_advantages(R))
    with pytest.raises(ValueError, match="group_size >= 2"):
        grpo_advantages(jnp.ones((3, 1)))
    with pytest.raises(ValueError, match="registered advantage estimator"):
        group_advantages(R, "ppo")
    with pytest.raises(ValueError, match="keeps state between steps"):
        group_advantages(R, "rae")
    # "none" is A = r (SPIRAL's w/o RAE); its carry, the RAE baselines, is a diagnostic only
    adv, base = ESTIMATORS["none"](R.reshape(-1), jnp.repeat(jnp.arange(2), 4), 2, None, jnp.zeros(2))
    np.testing.assert_allclose(adv, R.reshape(-1))
    np.testing.assert_allclose(base, ESTIMATORS["rae"](R.reshape(-1), jnp.repeat(jnp.arange(2), 4), 2, None,
                                                       jnp.zeros(2))[1])


def test_segment_and_broadcast_advantages_by_hand():
    r, ids = jnp.array([1.0, 0.0, 3.0, 5.0]), jnp.array([0, 0, 0, 1])
    centred = np.array([-1 / 3, -4 / 3, 5 / 3])
    std = np.sqrt((centred**2).mean())  # sqrt(14/9)
    np.testing.assert_allclose(segment_advantages(r, ids, 2, "grpo"), [*(centred / std), 0.0], rtol=1e-5)
    np.testing.assert_allclose(segment_advantages(r, ids, 2, "dr_grpo"), [*centred, 0.0], rtol=1e-5)
    np.testing.assert_allclose(segment_advantages(r, ids, 2, "rloo"), [*(centred * 1.5), 0.0], rtol=1e-5)
    # equal-size groups agree with the [P, G] form
    np.testing.assert_allclose(segment_advantages(R.reshape(-1), jnp.repeat(jnp.arange(2), 4), 2),
                               grpo_advantages(R).reshape(-1), atol=1e-5)
    np.testing.assert_allclose(broadcast_advantages(jnp.array([0.5, -1.0]), jnp.array([0, 0, 1, 0])), [0.5, 0.5, -1, 0.5])


# ratios [[1.5, 0.5], [1.0, 0.7]], mask [[1, 1], [1, 0]], advantages [1, -2], eps_low 0.2, eps_high 0.3:
# surrogates [[min(1.5, 1.3) = 1.3, min(0.5, 0.8) = 0.5], [-2, (masked)]]
LOGP = jnp.log(jnp.array([[1.5, 0.5], [1.0, 0.7]]))
OLD = jnp.zeros((2, 2))
ADV = jnp.array([1.0, -2.0])
MASK = jnp.array([[1.0, 1.0], [1.0, 0.0]])


@pytest.mark.parametrize("aggregation, expected", [
    ("token_mean", -(1.3 + 0.5 - 2.0) / 3),
    ("seq_mean", -((1.3 + 0.5) / 2 - 2.0) / 2),
    ("seq_sum_norm", -((1.3 + 0.5) / 4 - 2.0 / 4) / 2),
])
def test_clipped_policy_loss_by_hand(aggregation, expected):
    cfg = LossConfig(eps_low=0.2, eps_high=0.3, aggregation=aggregation, norm_len=4)
    loss, m = grpo_loss(LOGP, OLD, ADV, MASK, config=cfg)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)
    np.testing.assert_allclose(m["clip_fraction"], 1 / 3, rtol=1e-5)  # only token (0, 0) is clipped


def test_clipped_token_has_no_gradient_and_decoupled_clip():
    cfg = LossConfig(eps_low=0.2, eps_high=0.3)
    g = jax.grad(lambda lp: grpo_loss(lp, OLD, ADV, MASK, config=cfg)[0])(LOGP)
    assert g[0, 0] == 0 and g[1, 1] == 0 and g[0, 1] != 0 and g[1, 0] != 0
    # with eps_high 0.6 the 1.5 ratio is inside the range: surrogate 1.5 instead of 1.3
    loss, _ = grpo_loss(LOGP, OLD, ADV, MASK, config=LossConfig(eps_low=0.2, eps_high=0.6))
    np.testing.assert_allclose(loss, -(1.5 + 0.5 - 2.0) / 3, atol=1e-6)


def test_kl_estimators_and_total_loss_by_hand():
    lp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
    d = np.log(2.0)
    np.testing.assert_allclose(kl_estimate(lp, ref, "k1"), [[d]], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(lp, ref, "k2"), [[d * d / 2]], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(lp, ref, "k3"), [[0.5 + d - 1]], rtol=1e-5)
    # total = policy (-A * 1 with ratio 1) + 0.1 * k3 - 0.01 * entropy
    cfg = LossConfig(kl_coef=0.1, kl_estimator="k3", ent_coef=0.01)
    loss, m = grpo_loss(lp, lp, jnp.array([2.0]), jnp.ones((1, 1)), ref_logp=ref, entropy=jnp.array([[1.5]]), config=cfg)
    np.testing.assert_allclose(loss, -2.0 + 0.1 * (0.5 + d - 1) - 0.01 * 1.5, rtol=1e-5)
    np.testing.assert_allclose(m["kl"], 0.5 + d - 1, rtol=1e-5)


def test_aggregate_and_overlong_penalty_by_hand():
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = jnp.array([[1, 1, 1], [1, 0, 0]])
    np.testing.assert_allclose(aggregate(x, m, "token_mean"), 10 / 4)
    np.testing.assert_allclose(aggregate(x, m, "seq_mean"), (2 + 4) / 2)
    np.testing.assert_allclose(aggregate(x, m, "seq_sum_norm", 3), (6 / 3 + 4 / 3) / 2)
    # DAPO's overlong penalty is a reward function (GRPOConfig.overlong_cache adds it)
    ids = [[0] * n for n in (10, 16, 18, 20, 25)]
    np.testing.assert_allclose(Overlong(20, 4)([""] * 5, [""] * 5, completion_ids=ids), [0, 0, -0.5, -1, -1])
    with pytest.raises(ValueError, match="cache"):
        Overlong(20, 0)


@pytest.mark.parametrize("kw, msg", [
    (dict(aggregation="sum"), "aggregation"), (dict(aggregation="seq_sum_norm"), "norm_len"),
    (dict(kl_estimator="k4"), "kl_estimator"), (dict(eps_low=1.0), "eps_low"), (dict(kl_coef=-1.0), "kl_coef"),
])
def test_loss_config_errors(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LossConfig(**kw)


# --- registered variants: a new objective / estimator is one function -------------------------------------------

def test_gspo_sequence_ratio_by_hand():
    """GSPO: s = exp(mean over the sequence's tokens of log r): row 0: exp((log 1.5 + log 0.5) / 2) = sqrt(0.75);
    row 1 (one token): 1.0. eps 0.1: s_0 = 0.866 < 0.9 with A = +1 -> min(0.866, 0.9) = 0.866 (not clipped, lower side
    only binds for A < 0); row 1: -2. Every token of a sequence carries s; seq_mean -> -(0.866 - 2) / 2."""
    cfg = LossConfig(objective="gspo", eps_low=0.1, eps_high=0.1, aggregation="seq_mean")
    s0 = np.sqrt(0.75)
    loss, m = grpo_loss(LOGP, OLD, ADV, MASK, config=cfg)
    np.testing.assert_allclose(loss, -(s0 - 2.0) / 2, rtol=1e-5)
    np.testing.assert_allclose(m["ratio"], (2 * s0 + 1) / 3, rtol=1e-5)
    assert float(m["clip_fraction"]) == 0.0
    # A = -2 on row 0 instead: s_0 = 0.866 < 0.9 is clipped -> -2 * 0.9, and its gradient is 0
    adv = jnp.array([-2.0, -2.0])
    loss, m = grpo_loss(LOGP, OLD, adv, MASK, config=cfg)
    np.testing.assert_allclose(loss, -(-2 * 0.9 - 2.0) / 2, rtol=1e-5)
    np.testing.assert_allclose(m["clip_fraction"], 2 / 3, rtol=1e-5)  # both tokens of row 0
    g = jax.grad(lambda lp: grpo_loss(lp, OLD, adv, MASK, config=cfg)[0])(LOGP)
    assert np.all(np.asarray(g[0]) == 0) and g[1, 0] != 0
    # unclipped: d loss / d logp_t = -A s / (2 |y|) for each token (seq_mean of the broadcast value)
    g = jax.grad(lambda lp: grpo_loss(lp, OLD, ADV, MASK, config=cfg)[0])(LOGP)
    np.testing.assert_allclose(g[0], [-s0 / 2 / 2] * 2, rtol=1e-5)


def test_cispo_clipped_stopped_weights_by_hand():
    """CISPO: sg(clip(r, 0.8, 1.3)) A log pi, token mean. Weights [[1.3, 0.8], [1.0, (masked)]]; the clipped tokens
    keep a gradient (unlike PPO's clip): d loss / d logp = -w A / 3."""
    cfg = LossConfig(objective="cispo", eps_low=0.2, eps_high=0.3)
    lp = np.log([[1.5, 0.5], [1.0, 0.7]])
    loss, m = grpo_loss(LOGP, OLD, ADV, MASK, config=cfg)
    np.testing.assert_allclose(loss, -(1.3 * lp[0, 0] + 0.8 * lp[0, 1] - 2.0 * lp[1, 0]) / 3, rtol=1e-5)
    np.testing.assert_allclose(m["clip_fraction"], 2 / 3, rtol=1e-5)
    g = jax.grad(lambda x: grpo_loss(x, OLD, ADV, MASK, config=cfg)[0])(LOGP)
    np.testing.assert_allclose(g, [[-1.3 / 3, -0.8 / 3], [2.0 / 3, 0.0]], rtol=1e-5)


def test_registries_are_open_and_checked():
    from jaxrl_reason.rl.lm import loss as losses
    from jaxrl_reason.rl.lm.advantages import ESTIMATORS, estimate, register_estimator

    assert {"clip", "gspo", "cispo"} <= set(losses.OBJECTIVES) and {"grpo", "dr_grpo", "rloo", "rae"} <= set(ESTIMATORS)
    with pytest.raises(ValueError, match="objective must be one of"):
        LossConfig(objective="ppo2")
    with pytest.raises(ValueError, match="already registered"):
        losses.register_objective("clip")(lambda *a: None)
    with pytest.raises(ValueError, match="registered advantage estimator"):
        estimate("gae", R.reshape(-1), jnp.repeat(jnp.arange(2), 4), 2)

    @register_estimator("_test_max_baseline")
    def max_baseline(rewards, group_ids, num_groups, valid=None, carry=None):
        best = jax.ops.segment_max(rewards, group_ids, num_segments=num_groups)
        return rewards - best[group_ids], carry

    try:
        adv, _ = estimate("_test_max_baseline", R.reshape(-1), jnp.repeat(jnp.arange(2), 4), 2)
        np.testing.assert_allclose(adv, [0, -1, -1, 0, 0, 0, 0, 0])
    finally:
        del ESTIMATORS["_test_max_baseline"]


def test_estimators_by_hand_and_rae_is_spirals():
    from jaxrl_reason.rl.lm.advantages import estimate
    from jaxrl_reason.rl.rae import rae_advantages

    ids = jnp.repeat(jnp.arange(2), 4)
    for name, dense in (("grpo", grpo_advantages), ("dr_grpo", dr_grpo_advantages), ("rloo", rloo_advantages)):
        np.testing.assert_allclose(estimate(name, R.reshape(-1), ids, 2)[0], dense(R).reshape(-1), atol=1e-5)
    # invalid rows leave their group: group 0 is then [1, 0] (mean 0.5), row 3 gets 0
    valid = jnp.array([True, True, True, False] + [True] * 4)
    np.testing.assert_allclose(estimate("dr_grpo", R.reshape(-1), ids, 2, valid)[0],
                               [2 / 3, -1 / 3, -1 / 3, 0, 0, 0, 0, 0], atol=1e-6)
    # RAE (SPIRAL's EMA per group, alpha 0.05, read before the update): group 0 sees 1 then 0, group 1 sees 3:
    # advantages 1 - 0, 3 - 0, 0 - 0.05; baselines 0.95 * 0.05 = 0.0475 and 0.15; the same as rl.rae's
    from jaxrl_reason.rl.lm.advantages import ESTIMATORS

    r, g = jnp.array([1.0, 3.0, 0.0]), jnp.array([0, 1, 0])
    adv, base = ESTIMATORS["rae"](r, g, 2, None, jnp.zeros(2))
    np.testing.assert_allclose(adv, [1.0, 3.0, -0.05], atol=1e-6)
    np.testing.assert_allclose(base, [0.0475, 0.15], atol=1e-6)
    ref_adv, ref_base = rae_advantages(jnp.zeros((2, 1)), r[:, None], g)
    np.testing.assert_allclose(adv, ref_adv[:, 0]) and np.testing.assert_allclose(base, ref_base[:, 0])
