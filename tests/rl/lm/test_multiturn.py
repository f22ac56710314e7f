"""rl.lm.multiturn: the text-env protocol's rollouts (pure JAX inside jit, host on threads) against a reference
built turn by turn, the loss mask exactly the model's tokens, the sampler's log-probs where the learner scores them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sampler import SampleOutput, SamplerConfig
from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.lm.host_rollout import HostRollout
from jaxrl_reason.rl.lm.multiturn import (HostTextEnv, TextEnv, TextStep, lm_responder, make_rollout,
                                          make_turn_rollout, response_width)

P, O, T, N = 4, 3, 3, 4
STOP = 7


class Count(TextEnv):
    """Episode d (data) lasts d model turns; obs = [20 + turn, 30 + turn length]; reward = turn length / 10."""

    max_turns, prompt_tokens, obs_tokens = T, P, O

    def reset(self, key, data):
        b = data.shape[0]
        prompt = jnp.zeros((b, P), jnp.int32).at[:, 0].set(1).at[:, 1].set(10 + data)
        return {"d": data, "t": jnp.zeros((b,), jnp.int32)}, TextStep(
            prompt, jnp.full((b,), 2, jnp.int32), jnp.zeros((b,)), jnp.zeros((b,), bool))

    def step(self, key, state, turn, turn_len):
        t = state["t"] + 1
        obs = jnp.zeros((turn.shape[0], O), jnp.int32).at[:, 0].set(20 + t).at[:, 1].set(30 + turn_len)
        st = TextStep(obs, jnp.full(t.shape, 2, jnp.int32), turn_len / 10.0, t >= state["d"], {"t": t})
        return {**state, "t": t}, st


class HostCount(HostTextEnv):
    """``Count`` stepped in Python, one episode at a time."""

    max_turns, prompt_tokens, obs_tokens = T, P, O

    def reset(self, d):
        return {"d": d, "t": 0}, [1, 10 + d]

    def step(self, ep, turn):
        ep = {**ep, "t": ep["t"] + 1}
        return ep, [20 + ep["t"], 30 + len(turn)], len(turn) / 10.0, ep["t"] >= ep["d"]


def scripted(params, prompts, prompt_lens, key, live):
    """1 + (context length % 3) tokens 60, 61, ...; no sampling."""
    b = prompts.shape[0]
    n = jnp.where(live, 1 + prompt_lens % 3, 0)
    return SampleOutput(jnp.broadcast_to(60 + jnp.arange(N, dtype=jnp.int32), (b, N)), jnp.full((b, N), -0.5), n)


def reference(data):
    """The episodes built turn by turn in Python: (sequence, loss mask, rewards [T], turns, done)."""
    out = []
    for d in data:
        seq, mask, rewards, done, turns = [1, 10 + d], [], [0.0] * T, False, 0
        for t in range(T):
            n = 1 + len(seq) % 3
            seq += [60 + i for i in range(n)]
            mask += [1] * n
            turns += 1
            rewards[t] = n / 10
            if t + 1 >= d:
                done = True
                break
            if t < T - 1:
                seq += [20 + t + 1, 30 + n]
                mask += [0, 0]
        out.append((seq, mask, rewards, turns, done))
    return out


DATA = np.array([1, 2, 3, 5], np.int32)  # 5: truncated at T turns


def check_against_reference(ep, data):
    width = response_width(T, N, O)
    assert ep.seqs.shape == (len(data), P + width) and ep.loss_mask.shape == (len(data), width)
    for i, (seq, mask, rewards, turns, done) in enumerate(reference(data)):
        n = len(seq) - 2
        assert int(ep.prompt_lens[i]) == 2 and int(ep.lengths[i]) == n
        np.testing.assert_array_equal(np.asarray(ep.seqs[i, : 2 + n]), seq)
        assert np.all(np.asarray(ep.seqs[i, 2 + n:]) == 0)
        np.testing.assert_array_equal(np.asarray(ep.loss_mask[i, :n]), mask)
        assert not np.asarray(ep.loss_mask[i, n:]).any()
        np.testing.assert_allclose(np.asarray(ep.rewards[i]), rewards, rtol=1e-6)
        assert int(ep.turns[i]) == turns and bool(ep.done[i]) == done


def test_pure_env_rollout_inside_jit_matches_a_turn_by_turn_reference():
    ep = jax.jit(make_rollout(Count(), scripted, N))(None, jax.random.key(0), jnp.asarray(DATA))
    check_against_reference(ep, DATA)
    # episode 0 ended at turn 1 and kept its state (t = 1): later steps of it start again from t = 1
    np.testing.assert_array_equal(np.asarray(ep.info["t"])[:, 0], [1, 2, 2])
    np.testing.assert_array_equal(np.asarray(ep.info["t"])[:, 3], [1, 2, 3])
    r = ep.to_rollout(jnp.ones(4))
    np.testing.assert_array_equal(np.asarray(r.token_mask), np.asarray(ep.loss_mask))
    assert np.all(np.asarray(r.sample_logp)[np.asarray(ep.loss_mask) == 0] == 0)


@pytest.mark.parametrize("chunks", [1, 3])
def test_host_env_rollout_matches_the_reference(chunks):
    roll = HostRollout(HostCount(), scripted, N, chunks=chunks)
    ep, states = roll(None, jax.random.key(0), DATA.tolist())
    roll.close()
    check_against_reference(ep, DATA)
    assert [s["t"] for s in states] == [1, 2, 3, 3]


def tiny_lm():
    cfg = LMConfig(vocab_size=64, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32,
                   max_seq_len=P + response_width(T, N, O) + N)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    return nnx.split(model)


def test_host_rollout_draws_what_the_jitted_rollout_draws_with_a_sampling_lm():
    graphdef, state = tiny_lm()
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=1.0), [STOP])
    key = jax.random.key(3)
    a = jax.jit(make_rollout(Count(), respond, N))(state, key, jnp.asarray(DATA))
    roll = HostRollout(HostCount(), respond, N)
    b, _ = roll(state, key, DATA.tolist())
    roll.close()
    for f in ("seqs", "prompt_lens", "lengths", "loss_mask", "turns", "done"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(a.sample_logp), np.asarray(b.sample_logp), atol=1e-5)
    np.testing.assert_allclose(np.asarray(a.rewards), np.asarray(b.rewards), atol=1e-6)


def test_loss_mask_is_the_models_tokens_and_observations_get_no_gradient():
    graphdef, state = tiny_lm()
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=1.0), [STOP])
    ep = jax.jit(make_rollout(Count(), respond, N))(state, jax.random.key(1), jnp.asarray(DATA))
    mask = np.asarray(ep.loss_mask)
    # the loss mask is 1 exactly on the tokens the sampler wrote: the learner scores them as the sampler did
    rollout = ep.to_rollout(jnp.asarray([1.0, -1.0, 0.5, -0.5]))
    logp, _ = _score(graphdef, state, rollout)
    np.testing.assert_allclose(np.asarray(logp)[mask == 1], np.asarray(ep.sample_logp)[mask == 1], atol=1e-4)
    assert mask.sum() == int(np.sum(np.asarray(ep.lengths))) - 2 * _observations(ep)
    loss = make_loss(LossConfig(aggregation="token_mean"))
    grad = jax.grad(lambda lp: loss(lp, jax.lax.stop_gradient(lp), rollout.advantages, rollout.token_mask)[0])(logp)
    grad = np.asarray(grad)
    assert np.all(grad[mask == 0] == 0) and np.all(grad[mask == 1] != 0)


def _score(graphdef, state, rollout):
    from jaxrl_reason.models.lm.sequences import response_logprobs

    model = nnx.merge(graphdef, state)
    return response_logprobs(model, rollout.seqs, rollout.prompt_lens, rollout.mask.shape[1], 1.0)


def _observations(ep) -> int:
    """Observations appended: one after every turn but an episode's last."""
    return int(np.sum(np.asarray(ep.turns) - 1))


class Board(TextEnv):
    """Each observation is the whole next prompt: [1, 40 + turn]; ends after data turns."""

    max_turns, prompt_tokens, obs_tokens = T, 2, 2

    def reset(self, key, data):
        b = data.shape[0]
        obs = jnp.stack([jnp.ones((b,), jnp.int32), jnp.full((b,), 40, jnp.int32)], 1)
        return {"d": data, "t": jnp.zeros((b,), jnp.int32)}, TextStep(obs, jnp.full((b,), 2, jnp.int32),
                                                                     jnp.zeros((b,)), jnp.zeros((b,), bool))

    def step(self, key, state, turn, turn_len):
        t = state["t"] + 1
        obs = jnp.stack([jnp.ones_like(t), 40 + t], 1)
        return {**state, "t": t}, TextStep(obs, jnp.full(t.shape, 2, jnp.int32), jnp.ones(t.shape), t >= state["d"])


def test_turn_rollout_answers_each_observation_alone():
    turns, state = jax.jit(make_turn_rollout(Board(), scripted))(None, jax.random.key(0), jnp.asarray(DATA))
    np.testing.assert_array_equal(np.asarray(turns.prompts[:, 2, 1]), [40, 41, 42])  # episode 2: 3 turns
    np.testing.assert_array_equal(np.asarray(turns.live[:, 0]), [True, False, False])
    np.testing.assert_array_equal(np.asarray(turns.reward.sum(0)), [1, 2, 3, 3])
    np.testing.assert_array_equal(np.asarray(state["t"]), [1, 2, 3, 3])
    r = turns.to_rollout(jnp.ones((T, 4)))
    assert r.seqs.shape == (T * 4, 2 + N)  # rows turn-major: row 4 = turn 1 of episode 0 (ended), row 1 live
    assert float(r.mask[4].sum()) == 0 and float(r.mask[1].sum()) > 0


def test_bad_envs_and_observations_are_refused():
    class Long(HostCount):
        def step(self, ep, turn):
            return ep, [5] * (O + 1), 0.0, False

    roll = HostRollout(Long(), scripted, N)
    with pytest.raises(ValueError, match="observation of 4 tokens exceeds its width 3"):
        roll(None, jax.random.key(0), [2])
    roll.close()

    class NoTurns(HostCount):
        max_turns = 0

    with pytest.raises(ValueError, match="max_turns must be an int >= 1"):
        HostRollout(NoTurns(), scripted, N)


class Budget(Board):
    """``Board`` whose turn t may write at most 1 + t tokens (``TextStep.max_new``, set at reset and every step)."""

    def reset(self, key, data):
        state, st = super().reset(key, data)
        return state, st.replace(max_new=jnp.ones(data.shape, jnp.int32))

    def step(self, key, state, turn, turn_len):
        state, st = super().step(key, state, turn, turn_len)
        return state, st.replace(max_new=1 + state["t"])


def test_per_turn_token_limit_reaches_the_responder():
    graphdef, state = tiny_lm()
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=1.0), [STOP])
    data, key = jnp.full((8,), T, jnp.int32), jax.random.key(4)
    turns, _ = jax.jit(make_turn_rollout(Budget(), respond))(state, key, data)
    free, _ = jax.jit(make_turn_rollout(Board(), respond))(state, key, data)  # the same prompts, limit N
    lens, toks = np.asarray(turns.lengths), np.asarray(turns.tokens)
    for t in range(T):
        assert (lens[t] <= 1 + t).all() and (toks[t, :, 1 + t:] == 0).all()  # turn t: at most 1 + t tokens
        assert (lens[t] == 1 + t).mean() > 0.5  # (a row stops earlier only at a sampled STOP)
        # the same draws as without the limit, cut at it
        np.testing.assert_array_equal(toks[t, :, : 1 + t], np.asarray(free.tokens)[t, :, : 1 + t])
    assert (np.asarray(free.lengths) > 1 + np.arange(T)[:, None]).any()  # the limit cut something

    class OneToken(Count):  # make_rollout: every turn 1 token, so the model's tokens = its turns
        def reset(self, key, data):
            s, st = super().reset(key, data)
            return s, st.replace(max_new=jnp.ones(data.shape, jnp.int32))

        def step(self, key, state, turn, turn_len):
            s, st = super().step(key, state, turn, turn_len)
            return s, st.replace(max_new=jnp.ones(turn_len.shape, jnp.int32))

    ep = jax.jit(make_rollout(OneToken(), respond, N))(state, key, jnp.asarray(DATA))
    np.testing.assert_array_equal(np.asarray(ep.loss_mask).sum(1), np.asarray(ep.turns))

    class Unset(Budget):  # set at reset, not at a step
        def step(self, key, state, turn, turn_len):
            return Board.step(self, key, state, turn, turn_len)

    with pytest.raises(ValueError, match="max_new must be set at reset and at every step"):
        jax.jit(make_turn_rollout(Unset(), respond))(state, key, data)


def test_chained_turn_keys_and_a_rollout_that_records_nothing():
    class Chained(Board):
        chain_keys = True

    graphdef, state = tiny_lm()
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=1.0), [STOP])
    data, key = jnp.full((8,), T, jnp.int32), jax.random.key(5)
    turns, final = jax.jit(make_turn_rollout(Chained(), respond))(state, key, data)
    _, k_play = jax.random.split(key)
    for t in range(T):  # turn t's key: the t-th of the chain k_play, k = split(k_play), then split_key
        k_play, k = jax.random.split(k_play)
        out = respond(state, turns.prompts[t], turns.prompt_lens[t], jax.random.split(k)[0], turns.live[t])
        np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(turns.tokens[t]))
    split, _ = jax.jit(make_turn_rollout(Board(), respond))(state, key, data)
    assert not np.array_equal(np.asarray(split.tokens), np.asarray(turns.tokens))  # other keys, other draws
    none, final2 = jax.jit(make_turn_rollout(Chained(), respond, record=False))(state, key, data)
    assert none is None
    jax.tree.map(np.testing.assert_array_equal, final, final2)


# ---------------------------------------------------------------------------------------- the carried KV cache
STOPS = [7, 8, 9, 10, 11, 12]  # a random tiny LM stops a turn early now and then
T4 = 4


class Ragged(Count):
    """``Count`` over 4 turns whose observations have 0..O tokens (by episode, turn and turn length)."""

    max_turns = T4

    def step(self, key, state, turn, turn_len):
        state, st = super().step(key, state, turn, turn_len)
        obs = st.obs.at[:, 2].set(40 + state["d"])
        return state, st.replace(obs=obs, obs_len=(turn_len + state["t"] + state["d"]) % (O + 1))


class RaggedBudget(Ragged):
    """``Ragged`` whose turns have limits of 1..N tokens (``TextStep.max_new``)."""

    def reset(self, key, data):
        state, st = super().reset(key, data)
        return state, st.replace(max_new=1 + data % N)

    def step(self, key, state, turn, turn_len):
        state, st = super().step(key, state, turn, turn_len)
        return state, st.replace(max_new=1 + (state["t"] + state["d"]) % N)


class HostRagged(HostCount):
    """``Ragged`` stepped in Python."""

    max_turns = T4

    def step(self, ep, turn):
        ep, obs, r, d = super().step(ep, turn)
        n = (len(turn) + ep["t"] + ep["d"]) % (O + 1)
        return ep, (obs + [40 + ep["d"]])[:n], r, d


RAGGED = np.array([1, 2, 3, 5, 2, 5, 1, 4, 3, 5], np.int32)  # 5: truncated at 4 turns
WIDE = P + response_width(T4, N, O)  # an episode's KV cache


def small_lm(kind: str, max_seq_len: int = WIDE + N):
    cfg = {"gqa": dict(n_layers=2, n_heads=4, n_kv_heads=2, qkv_bias=True),
           "mla_unrolled": dict(n_layers=2, n_heads=2, attention="mla", kv_lora_rank=8, q_lora_rank=8, qk_nope_dim=4,
                                qk_rope_dim=4, v_head_dim=4, scan_layers=False),
           "window": dict(n_layers=1, n_heads=2, n_kv_heads=1, sliding_window=5)}[kind]
    model = Transformer(LMConfig(vocab_size=64, d_model=16, d_ff=32, max_seq_len=max_seq_len, **cfg), rngs=nnx.Rngs(2))
    return nnx.split(model)


def assert_same_episodes(a, b):
    """The same tokens (and everything that follows from them); the sampler's log-probs within float tolerance."""
    for f in ("seqs", "prompt_lens", "lengths", "loss_mask", "turns", "done"):
        np.testing.assert_array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), err_msg=f)
    np.testing.assert_allclose(np.asarray(a.sample_logp), np.asarray(b.sample_logp), atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(a.rewards), np.asarray(b.rewards), atol=1e-6)


def _no_whole_context(monkeypatch):
    """The carried path never samples on the whole context (``LMResponder.__call__``)."""
    from jaxrl_reason.rl.lm import multiturn

    def refuse(*a, **k):
        raise AssertionError("the carried rollout re-prefilled the context")

    monkeypatch.setattr(multiturn.LMResponder, "__call__", refuse)


@pytest.mark.parametrize("kind", ["gqa", "mla_unrolled", "window"])
def test_carried_cache_draws_what_reprefilling_the_context_draws(kind, monkeypatch):
    """Same key: the same tokens, the same log-probs (float tolerance) with the cache carried across turns as when
    every turn re-prefills the whole context; episodes that end early, observations of 0..O tokens, turns cut by a
    stop token or the per-turn limit (TextStep.max_new), greedy and sampling, observations prefilled in chunks."""
    graphdef, state = small_lm(kind)
    data, key = jnp.asarray(RAGGED), jax.random.key(7)
    cases = [(Ragged(), 1.0, {}), (RaggedBudget(), 1.0, {})]
    if kind == "gqa":
        cases += [(Ragged(), 0.0, {}), (RaggedBudget(), 1.0, dict(prefill_chunk=2)),
                  (Ragged(), 1.0, dict(stop_sequences=jnp.asarray([[-1, 13], [14, 15]], jnp.int32)))]
    for env, temperature, kw in cases:
        respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=temperature), STOPS, **kw)
        ref = jax.jit(make_rollout(env, respond, N, carry_cache=False))(state, key, data)
        with monkeypatch.context() as m:
            _no_whole_context(m)
            got = jax.jit(make_rollout(env, respond, N))(state, key, data)
        assert_same_episodes(got, ref)
        turns, lengths = np.asarray(ref.turns), np.asarray(ref.loss_mask).sum(1)
        assert (turns < T4).any() and (turns == T4).any()  # some ended early, some ran every turn
        assert (lengths < turns * N).any()  # some turns stopped before N tokens


def test_the_host_path_carries_the_cache_too(monkeypatch):
    """HostRollout with the cache: what make_rollout re-prefilling draws (one chunk), and with chunks what the host
    rollout re-prefilling draws."""
    graphdef, state = small_lm("gqa")
    key = jax.random.key(8)
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=1.0), STOPS)
    ref = jax.jit(make_rollout(Ragged(), respond, N, carry_cache=False))(state, key, jnp.asarray(RAGGED))
    for chunks in (1, 3):
        if chunks > 1:
            plain = HostRollout(HostRagged(), respond, N, chunks=chunks, carry_cache=False)
            ref, _ = plain(state, key, RAGGED.tolist())
            plain.close()
        roll = HostRollout(HostRagged(), respond, N, chunks=chunks)
        assert roll.carry_cache
        with monkeypatch.context() as m:
            _no_whole_context(m)
            got, states = roll(state, key, RAGGED.tolist())
        roll.close()
        assert_same_episodes(got, ref)
        assert [s["t"] for s in states] == np.minimum(RAGGED, T4).tolist()


def test_the_episode_cache_is_planned_for_t_turns():
    from jaxrl_reason.rl.lm.multiturn import episode_cache_bytes, episode_cache_len

    cfg = nnx.merge(*small_lm("gqa")).cfg
    assert episode_cache_len(P, T4, N, O) == WIDE == 4 + 4 * 4 + 3 * 3
    # 2 layers x (K + V: 2 kv heads x head dim 4) float32 per slot, + the int32 slot position; 10 episodes
    assert episode_cache_bytes(cfg, 10, P, T4, N, O) == 10 * WIDE * (2 * 2 * 2 * 4 * 4 + 4) + 4


def test_an_episode_past_the_models_window_is_refused_before_it_runs():
    graphdef, state = small_lm("gqa", max_seq_len=WIDE - 1)  # one slot short
    respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=1.0), STOPS)
    with pytest.raises(ValueError, match=f"P \\+ T N \\+ \\(T - 1\\) O = 4 \\+ 4 x 4 \\+ 3 x 3 = {WIDE} tokens"):
        jax.jit(make_rollout(Ragged(), respond, N))(state, jax.random.key(0), jnp.asarray(RAGGED))
    roll = HostRollout(HostRagged(), respond, N)
    with pytest.raises(ValueError, match="max_seq_len 28"):
        roll(state, jax.random.key(0), RAGGED.tolist())
    roll.close()
    longer = lm_responder(graphdef, SamplerConfig(max_new_tokens=N + 1), STOPS)  # turns past the planned N
    with pytest.raises(ValueError, match="up to 5 tokens a turn"):
        make_rollout(Ragged(), longer, N)
    make_rollout(Ragged(), longer, N, carry_cache=False)  # re-prefilling plans no cache: no error
    # a scripted responder keeps no cache: its rollout samples on the whole context, as before
    plain = HostRollout(HostRagged(), scripted, N)
    assert not plain.carry_cache
    plain.close()


class Framed(TextEnv):
    """Each prompt: the same 3 tokens [1, 2, 3], then [40 + turn, 50 + d] (row d % 3 == 0: no second one); turns have
    limits 1..N; declares ``shared_prefix = 3``."""

    max_turns, prompt_tokens, obs_tokens, shared_prefix = T, 6, 6, 3

    def _obs(self, t, d):
        b = d.shape[0]
        obs = jnp.zeros((b, 6), jnp.int32).at[:, :3].set(jnp.asarray([1, 2, 3])).at[:, 3].set(40 + t)
        return TextStep(obs.at[:, 4].set(50 + d), jnp.where(d % 3 == 0, 4, 5), jnp.zeros((b,)), t >= d,
                        max_new=1 + (t + d) % N)

    def reset(self, key, data):
        return {"d": data, "t": jnp.zeros_like(data)}, self._obs(jnp.zeros_like(data), data)

    def step(self, key, state, turn, turn_len):
        t = state["t"] + 1
        return {**state, "t": t}, self._obs(t, state["d"]).replace(reward=turn_len / 10.0)


class Unframed(Framed):
    """``Framed`` whose declared prefix is wrong from turn 1 on (the first token changes): each turn falls back."""

    def _obs(self, t, d):
        st = super()._obs(t, d)
        return st.replace(obs=st.obs.at[:, 0].set(1 + t))


def test_turn_rollout_shares_a_declared_prompt_prefix_exactly(monkeypatch):
    """make_turn_rollout with an env's shared_prefix: the prefix prefilled once (one row), each turn only the rest
    of its prompts: the draws of prefilling every prompt whole; a wrong declaration falls back, still exact."""
    from jaxrl_reason.rl.lm import multiturn

    graphdef, state = small_lm("gqa")
    data, key = jnp.asarray(RAGGED), jax.random.key(9)
    copies = []
    real = multiturn.repeat_rows
    monkeypatch.setattr(multiturn, "repeat_rows", lambda dec, b: copies.append(dec.pos.shape) or real(dec, b))
    for env in (Framed(), Unframed()):
        for temperature in (1.0, 0.0):
            respond = lm_responder(graphdef, SamplerConfig(max_new_tokens=N, temperature=temperature), STOPS)
            ref, ref_state = jax.jit(make_turn_rollout(env, respond, carry_cache=False))(state, key, data)
            got, got_state = jax.jit(make_turn_rollout(env, respond))(state, key, data)
            for f in ("prompts", "prompt_lens", "tokens", "lengths", "live", "done"):
                np.testing.assert_array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(ref, f)), err_msg=f)
            np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=2e-5)
            jax.tree.map(np.testing.assert_array_equal, got_state, ref_state)
            assert (np.asarray(ref.lengths) < N).any() and not np.asarray(ref.live).all()
    assert copies and all(s == (1,) for s in copies)  # the prefix's one-row cache, copied to the rows
    graphdef_u, state_u = small_lm("mla_unrolled")  # a per-layer cache (unrolled layers)
    respond = lm_responder(graphdef_u, SamplerConfig(max_new_tokens=N, temperature=1.0), STOPS)
    ref, _ = jax.jit(make_turn_rollout(Framed(), respond, carry_cache=False))(state_u, key, data)
    got, _ = jax.jit(make_turn_rollout(Framed(), respond))(state_u, key, data)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
    np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(ref.logprobs), atol=2e-5)

    class TooLong(Framed):
        shared_prefix = 7

    with pytest.raises(ValueError, match="shared_prefix must be an int in \\[0, prompt_tokens\\]"):
        make_turn_rollout(TooLong(), lm_responder(graphdef, SamplerConfig(max_new_tokens=N), STOPS))
