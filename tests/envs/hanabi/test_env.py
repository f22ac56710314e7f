"""Differential test against JaxMARL's Hanabi: same decks and moves -> same scores,
legal masks and (belief-mode) observations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("jaxmarl")
from jaxmarl.environments.hanabi.hanabi import HanabiEnv  # noqa: E402

from jaxrl_reason.envs.hanabi import Hanabi  # noqa: E402


@pytest.mark.bench
@pytest.mark.parametrize("num_players", [2])
def test_same_scores_masks_and_observations(num_players):
    ours = Hanabi(num_players=num_players, obs_mode="belief")
    ref = HanabiEnv(num_agents=num_players)
    cfg = ours.config
    step_ref, step_ours, legal_ref = jax.jit(ref.step_env), jax.jit(ours.step), jax.jit(ref.get_legal_moves)
    reset_ours = jax.jit(ours.reset_from_deck)
    reset_ref = jax.jit(ref.reset_from_deck_of_pairs)
    ended = 0
    for g in range(2):
        rng = np.random.default_rng(g)
        deck = rng.permutation(cfg.sorted_deck())
        _, rs = reset_ref(jnp.asarray(np.stack([deck // 5, deck % 5], 1)))
        s, ts = reset_ours(jnp.asarray(deck))
        for t in range(cfg.max_turns):
            lr = np.stack([np.asarray(v) for v in legal_ref(rs).values()]).astype(bool)
            np.testing.assert_array_equal(lr, np.asarray(ts.legal_action_mask))
            p = int(ts.current_player)
            options = list(np.flatnonzero(lr[p]))
            # mostly avoid misplays so that games reach the end of the deck
            h = cfg.hand_size
            safe = [a for a in options if not (h <= a < 2 * h) or
                    int(s.hands[p, a - h]) % 5 == int(s.fireworks[int(s.hands[p, a - h]) // 5])]
            a = int(rng.choice(safe if safe and rng.random() < 0.97 else options))
            acts = {ag: (a if i == p else ref.num_moves - 1) for i, ag in enumerate(ref.agents)}
            obs_r, rs, rew_r, done_r, _ = step_ref(jax.random.key(t), rs, acts)
            s, ts = step_ours(jax.random.key(t), s, jnp.int32(a))
            o_r = np.stack([np.asarray(obs_r[ag]) for ag in ref.agents])
            np.testing.assert_allclose(np.asarray(ts.obs), o_r, atol=1e-6)
            assert float(rew_r["agent_0"]) == float(ts.reward[0]) and int(rs.score) == int(s.score)
            assert bool(done_r["__all__"]) == bool(ts.terminated)
            if bool(ts.terminated):
                ended += int(s.num_dealt) == cfg.deck_size
                break
    assert ended >= 1, "no game reached the end of the deck"
