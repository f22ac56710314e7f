"""Small learning tests (fixed seeds): self-play lowers Kuhn exploitability; AlphaZero runs."""

import jax
import numpy as np
import pytest

from jaxrl_reason.envs.games import GAMES, kuhn_poker
from jaxrl_reason.rl.selfplay import SelfPlay, SelfPlayConfig


@pytest.mark.slow
def test_kuhn_rae_selfplay_lowers_exploitability():
    cfg = SelfPlayConfig(env="kuhn_poker", advantage="rae", num_envs=128, num_steps=8,
                         num_updates=80, num_minibatches=2)
    metrics_fn = GAMES["kuhn_poker"].policy_metrics  # the game's exact exploitability (GameSpec)
    sp = SelfPlay(cfg, metrics_fn=metrics_fn)
    state = sp.init(jax.random.key(0))
    initial = float(metrics_fn(lambda o, m: sp.probs(state.params, o, m))["exploitability"])
    _, metrics = jax.jit(sp.train)(jax.random.key(0))
    final = float(np.mean(np.asarray(metrics["exploitability"])[-10:]))
    assert np.isfinite(np.asarray(metrics["policy_loss"])).all()
    assert final < initial - 0.03, (initial, final)
    assert final < float(kuhn_poker.exploitability(kuhn_poker.uniform_policy()))
    # self-play converges in average: the time-averaged policy is less exploitable than the iterates
    averaged = float(kuhn_poker.average_exploitability_curve(metrics["policy_table"])[-1])
    print("initial, final iterate (mean of 10), time-averaged:", initial, final, averaged)
    assert averaged < final, (averaged, final)


def test_selfplay_config_rejects_bad_values():
    with pytest.raises(ValueError, match="advantage"):
        SelfPlayConfig(advantage="gae2")
