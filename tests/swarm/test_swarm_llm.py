"""LLM intent policy: text rendering of local observations, two-stage interface, SFT data."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.agents.rally import llm
from jaxrl_reason.agents.rally.intent import RulePrior, act
from jaxrl_reason.models.lm import Transformer

ENV = envs.make("swarm", num_agents=3, num_targets=2, max_steps=10)


def test_prompt_rendering_is_readable_and_fixed_length():
    state, ts = jax.jit(ENV.reset)(jax.random.key(0))
    state = state.replace(pos=jnp.array([[-0.5, 0.2], [0.9, -0.9], [0.9, 0.9]]),
                          target_pos=jnp.array([[-0.5, 0.5], [0.5, -0.5]]), urgency=jnp.array([1.0, 0.5]),
                          adv_pos=jnp.array([[-0.9, 0.9]]))
    obs, nbrs = ENV.encode(state)
    ids = llm.render_prompt(ENV, obs)
    text = llm.to_text(ids)
    assert ids.shape[0] == 3 and len(set(len(t) for t in text)) == 1
    # UAV 0: active, sees target 0 at distance 0.3 (digit round(0.3/1.2*9)=2), urgency 9, unserved
    assert text[0].startswith("A9 E9 T0v2900 T1-0000 ?"), text[0]
    full = llm.to_text(llm.render_consensus(ids, jnp.array([0, 4, 5]), jnp.array([[1, -1], [-1, -1], [-1, -1]])))
    assert full[0].endswith("?a N:e- ?"), full[0]


def test_llm_policy_interface_gives_valid_actions():
    model = Transformer(llm.default_lm_config(), rngs=nnx.Rngs(0))
    policy = llm.LLMIntentPolicy(ENV, nnx.graphdef(model), nnx.state(model), greedy=False)
    _, ts = jax.jit(ENV.reset)(jax.random.key(1))
    a = np.asarray(jax.jit(lambda k, ts: act(policy, k, ts))(jax.random.key(2), ts))
    assert a.shape == (3,) and ((a >= 0) & (a < ENV.num_actions)).all()


def test_prior_traces_hold_the_prior_answers():
    seqs = jax.jit(lambda k: llm.prior_traces(ENV, RulePrior(ENV), k, num_envs=2, steps=3))(jax.random.key(0))
    assert seqs.shape[0] == 2 * 3 * 3
    text = llm.to_text(seqs)
    assert all(t[-1] in "abcdef" and t[-2] == "?" for t in text), text[:2]
