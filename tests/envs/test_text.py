"""envs.text: ``FixedTextEnv`` gives each episode its prompt, the same observation after every turn, never an end
or a reward; bad shapes are refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.envs.text import FixedTextEnv


def test_fixed_text_env_prompts_observations_and_no_end():
    env = FixedTextEnv(np.array([[1, 2, 3], [4, 5, 0]]), np.array([3, 2]), np.array([7, 8]), max_turns=4)
    assert (env.max_turns, env.prompt_tokens, env.obs_tokens) == (4, 3, 2)
    state, first = env.reset(jax.random.key(0), jnp.array([1, 0, 1]))
    np.testing.assert_array_equal(first.obs, [[4, 5, 0], [1, 2, 3], [4, 5, 0]])
    np.testing.assert_array_equal(first.obs_len, [2, 3, 2])
    state, st = env.step(jax.random.key(1), state, jnp.zeros((3, 5), jnp.int32), jnp.full((3,), 5))
    np.testing.assert_array_equal(st.obs, [[7, 8]] * 3)
    np.testing.assert_array_equal(st.obs_len, [2, 2, 2])
    assert not np.any(st.done) and not np.any(st.reward) and np.all(state == 1)


def test_fixed_text_env_refuses_bad_shapes():
    with pytest.raises(ValueError, match="prompts"):
        FixedTextEnv(np.array([1, 2]), np.array([2]), np.array([3]), 2)
    with pytest.raises(ValueError, match="prompt_lens"):
        FixedTextEnv(np.array([[1, 2]]), np.array([3]), np.array([3]), 2)
