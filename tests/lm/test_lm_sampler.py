"""Sampler: greedy == argmax of the full forward, stop tokens / per-sequence lengths, filtering."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample, sampling_logprobs

CFG = LMConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, qkv_bias=True, tie_embeddings=True)
PROMPTS = jax.random.randint(jax.random.PRNGKey(0), (3, 6), 1, 64)
LENS = jnp.array([6, 3, 5])


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def greedy(model):
    return sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), SamplerConfig(max_new_tokens=6, temperature=0.0))


def test_greedy_equals_argmax_of_full_forward(model, greedy):
    fwd = nnx.jit(lambda m, t: m(t)[0])
    for b in range(3):
        n = int(LENS[b])
        seq = jnp.concatenate([PROMPTS[b, :n], greedy.tokens[b]])[None]
        logits = fwd(model, seq)[0]
        np.testing.assert_array_equal(np.asarray(jnp.argmax(logits[n - 1 : -1], -1)), np.asarray(greedy.tokens[b]))
        lp = jax.nn.log_softmax(logits[n - 1 : -1])
        np.testing.assert_allclose(np.take_along_axis(lp, greedy.tokens[b][:, None], 1)[:, 0], greedy.logprobs[b], atol=1e-5)


def test_stop_tokens_and_per_sequence_lengths(model, greedy):
    # stop sequence 0 on its 3rd greedy token; give sequence 2 a budget of 2 tokens
    stop = jnp.array([[int(greedy.tokens[0, 2]), -1], [-1, -1], [-1, -1]])
    out = sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), SamplerConfig(max_new_tokens=6, temperature=0.0),
                 stop_tokens=stop, max_new_tokens=jnp.array([6, 6, 2]))
    first = int(np.argmax(np.asarray(greedy.tokens[0]) == int(greedy.tokens[0, 2])))
    assert list(np.asarray(out.lengths)) == [first + 1, 6, 2]
    np.testing.assert_array_equal(out.tokens[0, : first + 1], greedy.tokens[0, : first + 1])
    assert np.all(np.asarray(out.tokens[0, first + 1 :]) == 0) and np.all(np.asarray(out.logprobs[2, 2:]) == 0)
    np.testing.assert_array_equal(out.tokens[1], greedy.tokens[1])


def test_sampling_logprobs_filters():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    p = jnp.exp(sampling_logprobs(logits, 1.0, top_k=2))
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], atol=1e-6)
    p = jnp.exp(sampling_logprobs(logits, 1.0, top_p=0.7))  # smallest prefix with mass >= 0.7: 2 tokens
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], atol=1e-6)
    p = jnp.exp(sampling_logprobs(logits, 0.5))
    np.testing.assert_allclose(p, jax.nn.softmax(2 * logits), atol=1e-6)


def test_sampled_logprobs_are_of_sampled_tokens(model):
    cfg = SamplerConfig(max_new_tokens=4, temperature=0.8, top_k=10)
    out = sample(model, PROMPTS, LENS, jax.random.PRNGKey(2), cfg)
    assert out.tokens.shape == (3, 4) and np.all(np.asarray(out.logprobs) <= 0)
    assert np.all(np.asarray(out.logprobs) > np.log(1e-6))  # never a filtered (-inf) token
    again = sample(model, PROMPTS, LENS, jax.random.PRNGKey(2), cfg)
    np.testing.assert_array_equal(out.tokens, again.tokens)
