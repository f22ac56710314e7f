"""Small learning tests (fixed seeds): self-play lowers Kuhn exploitability; AlphaZero runs."""

import jax
import numpy as np
import pytest

from jaxrl_reason.envs.games import GAMES, kuhn_poker
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.rl.selfplay import SelfPlay, SelfPlayConfig
from jaxrl_reason.search.alphazero import AlphaZero, AlphaZeroConfig


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


def test_selfplay_and_alphazero_configs_reject_bad_values():
    with pytest.raises(ValueError, match="advantage"):
        SelfPlayConfig(advantage="gae2")
    with pytest.raises(ValueError, match="num_simulations"):
        AlphaZeroConfig(num_simulations=0)
    with pytest.raises(ValueError, match="value_target"):
        AlphaZeroConfig(value_target="bootstrap")
    with pytest.raises(ValueError, match="explore_eps"):
        AlphaZeroConfig(explore_eps=1.5)


@pytest.mark.slow
def test_alphazero_iteration_runs_and_search_beats_random():
    import jax.numpy as jnp

    from jaxrl_reason import envs
    from jaxrl_reason.envs.games import arena

    cfg = AlphaZeroConfig(num_envs=32, rollout_length=9, num_simulations=8, sgd_steps=2,
                          minibatch_size=128, hidden=(32,))
    az = AlphaZero(cfg)
    state, m = az.iteration(az.init(jax.random.key(0)))
    assert np.isfinite(float(m["loss"])) and int(m["episodes"]) > 0
    # the search itself (uniform prior, real simulator) wins far more than random does
    env = envs.make("tictactoe")

    def searcher(key, s, ts):
        from jaxrl_reason.search.alphazero import search, uniform_evaluate

        return search(env, uniform_evaluate, None, key, s, ts, 16, 9, 1.0).action.astype(jnp.int32)

    ret, illegal = jax.jit(lambda k: arena.play(env, (searcher, O.batched(O.random_action)), k, 100))(jax.random.key(1))
    base, _ = jax.jit(lambda k: arena.play(env, (O.batched(O.random_action),) * 2, k, 100))(jax.random.key(1))
    assert int(illegal) == 0
    assert float((ret[:, 0] > 0).mean()) > float((base[:, 0] > 0).mean()) + 0.1
    assert float((ret[:, 0] < 0).mean()) < 0.5 * float((base[:, 0] < 0).mean())
