"""LLM intent policy: text rendering of local observations, two-stage interface, SFT data."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.agents.rally import llm
from jaxrl_reason.agents.rally.intent import RulePrior, act
from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.models.tokenizer import ByteTokenizer

ENV = envs.make("swarm", num_agents=3, num_targets=2, max_steps=10)
TOK = ByteTokenizer()


def test_prompt_rendering_is_readable_and_fixed_length():
    state, ts = jax.jit(ENV.reset)(jax.random.key(0))
    state = state.replace(pos=jnp.array([[-0.5, 0.2], [0.9, -0.9], [0.9, 0.9]]),
                          target_pos=jnp.array([[-0.5, 0.5], [0.5, -0.5]]), urgency=jnp.array([1.0, 0.5]),
                          adv_pos=jnp.array([[-0.9, 0.9]]))

    @jax.jit  # one program: eagerly, each op of the rendering compiles on its own
    def render(state):
        ids = llm.render_prompt(ENV, ENV.encode(state)[0], TOK)
        return ids, llm.render_consensus(ids, jnp.array([0, 4, 5]), jnp.array([[1, -1], [-1, -1], [-1, -1]]), TOK)

    ids, consensus = render(state)
    text = llm.to_text(ids, TOK)
    assert ids.shape[0] == 3 and len(set(len(t) for t in text)) == 1
    # UAV 0: active, sees target 0 at distance 0.3 (digit round(0.3/1.2*9)=2), urgency 9, unserved
    assert text[0].startswith("A9 E9 T0v2900 T1-0000 ?"), text[0]
    full = llm.to_text(consensus, TOK)
    assert full[0].endswith("?a N:e- ?"), full[0]


def test_llm_policy_interface_gives_valid_actions():
    model = Transformer(llm.default_lm_config(TOK), rngs=nnx.Rngs(0))
    policy = llm.LLMIntentPolicy(ENV, nnx.graphdef(model), nnx.state(model), greedy=False, tokenizer=TOK)
    _, ts = jax.jit(ENV.reset)(jax.random.key(1))
    a = np.asarray(jax.jit(lambda k, ts: act(policy, k, ts))(jax.random.key(2), ts))
    assert a.shape == (3,) and ((a >= 0) & (a < ENV.num_actions)).all()


def test_prior_traces_hold_the_prior_answers():
    seqs = jax.jit(lambda k: llm.prior_traces(ENV, RulePrior(ENV), k, num_envs=2, steps=3, tokenizer=TOK))(jax.random.key(0))
    assert seqs.shape[0] == 2 * 3 * 3
    text = llm.to_text(seqs, TOK)
    assert all(t[-1] in "abcdef" and t[-2] == "?" for t in text), text[:2]


def test_grpo_finetune_runs_and_logp_matches_sampling_policy():
    from jaxrl_reason.agents.rally import llm_grpo

    env = envs.make("swarm", num_agents=2, num_targets=2, max_steps=4)
    cfg = llm.default_lm_config(TOK)
    model = Transformer(dataclasses.replace(cfg, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=16),
                        rngs=nnx.Rngs(0))
    policy = llm.LLMIntentPolicy(env, nnx.graphdef(model), nnx.state(model), tokenizer=TOK)

    @jax.jit  # one program (eagerly, each op of the rendering and the two forwards compiles on its own)
    def logps(key):
        _, ts = env.reset(key)
        prompt = llm.render_prompt(env, ts.obs, TOK)
        seq = llm.render_consensus(prompt, jnp.array([1, 4]), ts.info["neighbors"], TOK)
        flat = jnp.concatenate([seq, llm._letter(jnp.array([2, 5]), TOK)[:, None]], -1)
        lp = llm_grpo.answer_logp(model, env, flat, prompt.shape[1], TOK)
        return lp, jax.nn.log_softmax(policy.action_logits(seq)), jax.nn.log_softmax(policy.action_logits(prompt))

    lp, final, proposal = logps(jax.random.key(0))
    np.testing.assert_allclose(np.asarray(lp[:, 1]), np.asarray(final)[[0, 1], [2, 5]], atol=1e-4)
    np.testing.assert_allclose(np.asarray(lp[:, 0]), np.asarray(proposal)[[0, 1], [1, 4]], atol=1e-4)
    cfg = llm_grpo.IntentGRPOConfig(iterations=1, num_groups=2, group_size=2, updates=2, minibatch=8)
    tuned, stats = llm_grpo.grpo_finetune(policy, jax.random.key(1), cfg)
    assert len(stats["mean_return"]) == 1 and 0 < stats["env_steps"] <= 4 * 4
    before = jax.tree.leaves(nnx.state(model, nnx.Param))
    after = jax.tree.leaves(nnx.state(nnx.merge(tuned.graphdef, tuned.params), nnx.Param))
    assert any(not np.allclose(a, b) for a, b in zip(before, after)), "GRPO must update the LM"


def test_policy_takes_its_tokenizer():
    """No global tokenizer: the policy is built with its LM's tokenizer, whose letter ids it reads."""
    from jaxrl_reason.models.tokenizer import CharTokenizer

    model = Transformer(llm.default_lm_config(TOK), rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match="tokenizer"):
        llm.LLMIntentPolicy(ENV, nnx.graphdef(model), nnx.state(model))
    for tok in (TOK, CharTokenizer()):
        letters = llm._letter(jnp.arange(ENV.num_actions), tok)
        assert tok.decode(np.asarray(letters).tolist()) == "abcdef"
        np.testing.assert_array_equal(np.asarray(llm.letter_action(letters, tok)), np.arange(ENV.num_actions))
    _, ts = jax.jit(ENV.reset)(jax.random.key(1))
    char = CharTokenizer()  # another vocabulary renders the same text
    assert llm.to_text(llm.render_prompt(ENV, ts.obs, char), char) == llm.to_text(llm.render_prompt(ENV, ts.obs, TOK), TOK)


def test_intent_agent_is_a_rollout_of_the_learner_with_any_estimator():
    """``intent_learner``: the decisions are rows of their episode (``sample``), the returns grouped by start state,
    the keys those of ``grpo_finetune``'s iterations, the reference kept (KL term); RLOO runs through it."""
    from jaxrl_reason.agents.rally import llm_grpo

    env = envs.make("swarm", num_agents=2, num_targets=2, max_steps=4)
    model = Transformer(dataclasses.replace(llm.default_lm_config(TOK), d_model=16, n_layers=1, n_heads=2,
                                            n_kv_heads=1, d_ff=16), rngs=nnx.Rngs(0))
    policy = llm.LLMIntentPolicy(env, nnx.graphdef(model), nnx.state(model), tokenizer=TOK)
    cfg = llm_grpo.IntentGRPOConfig(iterations=3, num_groups=2, group_size=2, updates=2, minibatch=8, advantage="rloo")
    learner, agent = llm_grpo.intent_learner(policy, cfg)
    assert learner.config.old_logp == "recompute" and learner.config.needs_ref
    key = jax.random.key(1)
    want = jax.random.split(jax.random.split(key, 3)[2])
    np.testing.assert_array_equal(jax.random.key_data(jnp.stack(agent.keys(key, 2))), jax.random.key_data(want))
    state = learner.init(key, agent)
    rows, m = agent.rollout(learner.policy(state), jax.random.key(2))
    T, B, A = env.max_episode_steps, cfg.episodes, env.num_agents
    assert len(rows) == T * B * A and rows.rewards.shape == (B,)
    np.testing.assert_array_equal(np.asarray(rows.groups), [0, 0, 1, 1])
    np.testing.assert_array_equal(np.asarray(rows.sample).reshape(T, B, A)[3], np.repeat(np.arange(B)[:, None], A, 1))
    assert float(rows.mask[:, 0].sum()) == float(m["env_steps"]) * A
    state, m = learner.step(state, agent)
    assert int(state.step) == 1 and np.isfinite(float(m["loss"])) and "kl" in m
    with pytest.raises(ValueError, match="registered advantage estimator"):
        llm_grpo.IntentGRPOConfig(advantage="nope")
