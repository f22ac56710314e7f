"""Property tests over random play (hypothesis) and observation decoding."""

import functools

import jax
import numpy as np
from hypothesis import given, settings, strategies as st

from jaxrl_reason import envs
from jaxrl_reason.envs.hanabi import Hanabi, decode, encoding

T, B = 60, 4


@functools.lru_cache(maxsize=None)
def rollout_fn(num_players, obs_mode="canonical"):
    env = Hanabi(num_players=num_players, obs_mode=obs_mode)
    wrapped = envs.AutoReset(env)

    @jax.jit
    def rollout(key):
        state, ts = jax.vmap(wrapped.reset)(jax.random.split(key, B))

        def body(carry, k):
            state, ts = carry
            ka, ks = jax.random.split(k)
            a = jax.vmap(envs.random_legal_action, (0, None, 0))(jax.random.split(ka, B), env, ts)
            nstate, nts = jax.vmap(wrapped.step)(jax.random.split(ks, B), state, a)
            return (nstate, nts), (state, ts)

        _, traj = jax.lax.scan(body, (state, ts), jax.random.split(key, T))
        return traj

    return env, rollout


def flat(tree):
    return jax.tree.map(lambda x: np.asarray(x).reshape(T * B, *x.shape[2:]), tree)


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), num_players=st.sampled_from([2, 5]))
def test_invariants_under_random_play(seed, num_players):
    env, rollout = rollout_fn(num_players)
    cfg = env.config
    s, ts = flat(rollout(jax.random.key(seed)))
    in_hands = (s.hands >= 0).sum((1, 2))
    total = in_hands + (cfg.deck_size - s.num_dealt) + s.discards.sum(1) + s.fireworks.sum(1)
    assert (total == cfg.deck_size).all()  # card conservation
    assert (s.deck_counts.sum(1) == cfg.deck_size - s.num_dealt).all()
    assert ((s.score >= 0) & (s.score <= cfg.max_score)).all()
    assert ((s.info_tokens >= 0) & (s.info_tokens <= cfg.max_info_tokens)).all()
    assert ((s.life_tokens >= 1) & (s.life_tokens <= cfg.max_life_tokens)).all()  # pre-step states
    mask = ts.legal_action_mask
    h = cfg.hand_size
    for i in range(T * B):
        p = int(ts.current_player[i])
        has = s.hands[i, p] >= 0
        np.testing.assert_array_equal(mask[i, p, :h], has & (s.info_tokens[i] < cfg.max_info_tokens))
        np.testing.assert_array_equal(mask[i, p, h:2 * h], has)
        assert not mask[i, p, -1]
        hints = mask[i, p, 2 * h:-1]
        assert s.info_tokens[i] > 0 or not hints.any()
        others = np.delete(np.arange(num_players), p)
        assert (mask[i, others, :-1] == 0).all() and mask[i, others, -1].all()
        if s.info_tokens[i] > 0:  # every colour hint touches at least one card
            cols = mask[i, p, 2 * h: cfg.rank_hint_start].reshape(num_players - 1, cfg.num_colours)
            for o in range(num_players - 1):
                target = s.hands[i, (p + 1 + o) % num_players]
                present = np.isin(np.arange(cfg.num_colours), target[target >= 0] // cfg.num_ranks)
                np.testing.assert_array_equal(cols[o], present)


def test_observation_sections_decode_to_state():
    for num_players, mode in [(2, "canonical"), (3, "compact"), (2, "belief")]:
        env, rollout = rollout_fn(num_players, mode)
        cfg = env.config
        n = num_players
        s, ts = flat(rollout(jax.random.key(7)))
        assert ts.obs.shape[-1] == encoding.obs_size(cfg, mode)
        if (n, mode) == (2, "canonical"):
            assert env.obs_shape == (658,)
        for i in range(0, T * B, 17):
            for obs_player in range(n):
                d = decode(cfg, ts.obs[i, obs_player], mode)
                rel = [(obs_player + j) % n for j in range(n)]
                np.testing.assert_array_equal(d["other_hands"], s.hands[i, rel[1:]])
                np.testing.assert_array_equal(d["missing"], (s.hands[i, rel] < 0).any(1))
                assert d["deck_size"] == cfg.deck_size - s.num_dealt[i]
                assert d["info_tokens"] == s.info_tokens[i] and d["life_tokens"] == s.life_tokens[i]
                np.testing.assert_array_equal(d["fireworks"], s.fireworks[i])
                np.testing.assert_array_equal(d["discards"], s.discards[i])
                plaus = s.colour_plausible[i][..., :, None] & s.rank_plausible[i][..., None, :]
                plaus = plaus.reshape(n, cfg.hand_size, -1)[rel]
                if mode == "belief":  # V0 belief: zero for kinds with no copy left
                    played = (s.fireworks[i][:, None] > np.arange(cfg.num_ranks)).reshape(-1)
                    plaus = plaus & (cfg.card_counts() - s.discards[i] - played > 0)
                np.testing.assert_array_equal(d["plausible"], plaus)
                if mode == "belief":
                    sums = d["belief"].sum(-1)
                    np.testing.assert_allclose(sums[s.hands[i, rel] >= 0], 1.0, rtol=1e-5)
                if mode != "compact":
                    hands = s.hands[i, rel]
                    exp_c = np.where(s.colour_hinted[i, rel], hands // cfg.num_ranks, -1)
                    exp_r = np.where(s.rank_hinted[i, rel], hands % cfg.num_ranks, -1)
                    np.testing.assert_array_equal(d["colour_revealed"], exp_c)
                    np.testing.assert_array_equal(d["rank_revealed"], exp_r)
                last = d["last"]
                if s.last_action[i] < 0:
                    assert not any(v.any() for v in last.values())
                else:
                    assert last["actor"].argmax() == (s.last_actor[i] - obs_player) % n
                    if s.last_card[i] >= 0:
                        assert last["card"].argmax() == s.last_card[i]
