"""The dense (Qwen2-like: GQA, QKV bias, tied embeddings) family: sampler, joined output, chunked
log-probs and entropy. One model and few compiled shapes are shared by all tests here."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer, init_cache
from jaxrl_reason.models.lm import sampler as sampler_module
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample, sample_joined, sampling_logprobs
from jaxrl_reason.models.lm.train import token_logprobs, token_logprobs_entropy
from jaxrl_reason.parallel.mesh import make_mesh

CFG = LMConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True, tie_embeddings=True)
PROMPTS = jax.random.randint(jax.random.PRNGKey(0), (3, 6), 1, 64)
LENS = jnp.array([6, 3, 5])
N = 6
GREEDY = SamplerConfig(max_new_tokens=N, temperature=0.0)
FWD = nnx.jit(lambda m, t: m(t)[0])
TEMP = 0.7
LOGPROBS = nnx.jit(lambda m, t: (token_logprobs(m, t, chunk=4), token_logprobs_entropy(m, t, chunk=4, temperature=TEMP)))


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def greedy(model):
    return sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY)


@pytest.fixture(scope="module")
def joined(greedy):
    return greedy.join(PROMPTS, LENS)


@pytest.fixture(scope="module")
def logits(model, joined):
    return FWD(model, joined.tokens)  # [3, P+N, V]


def test_joined_layout(greedy, joined):
    for b in range(3):
        n = int(LENS[b])
        want = np.concatenate([PROMPTS[b, :n], greedy.tokens[b], np.zeros(6 - n, int)])
        np.testing.assert_array_equal(joined.tokens[b], want)
        np.testing.assert_array_equal(joined.prompt_mask[b], np.arange(12) < n)
        np.testing.assert_array_equal(joined.completion_mask[b], (np.arange(12) >= n) & (np.arange(12) < n + N))
        np.testing.assert_array_equal(joined.logprobs[b, n : n + N], greedy.logprobs[b])
    assert float(jnp.sum(jnp.where(joined.completion_mask, 0.0, jnp.abs(joined.logprobs)))) == 0.0


def test_greedy_equals_argmax_of_full_forward(greedy, joined, logits):
    for b in range(3):
        n = int(LENS[b])
        lg = logits[b, n - 1 : n - 1 + N]
        np.testing.assert_array_equal(np.asarray(jnp.argmax(lg, -1)), np.asarray(greedy.tokens[b]))
        lp = jax.nn.log_softmax(lg)
        np.testing.assert_allclose(np.take_along_axis(lp, greedy.tokens[b][:, None], 1)[:, 0], greedy.logprobs[b], atol=1e-5)


def test_unrolled_layers_decode_equals_scanned(greedy, monkeypatch):
    """scan_layers=False: per-layer weights and cache in the decode loop, same weights, same tokens; and the scanned
    decode (stacked weights and cache), where the sampler keeps it (off CPU)."""
    unrolled = Transformer(dataclasses.replace(CFG, scan_layers=False), rngs=nnx.Rngs(0))
    out = sample(unrolled, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY)
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.logprobs, greedy.logprobs, atol=1e-5)
    monkeypatch.setattr(sampler_module, "decodes_unstacked", lambda cfg: False)
    scanned = Transformer(dataclasses.replace(CFG, max_seq_len=CFG.max_seq_len + 1), rngs=nnx.Rngs(0))  # new trace
    out = sample(scanned, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY)
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_allclose(out.logprobs, greedy.logprobs, atol=1e-5)
    layers = unrolled.layer_states()
    assert len(layers) == CFG.n_layers and isinstance(init_cache(CFG, 3, 8, stacked=False).buffers, tuple)
    with pytest.raises(ValueError, match="per-layer cache"):
        unrolled.hidden(PROMPTS, None, init_cache(CFG, 3, 8), layers)


def test_chunked_logprobs_and_entropy_equal_full(model, joined, logits):
    """token_logprobs (T=1) and token_logprobs_entropy (T=0.7), chunk 4 over 11 targets (padded to 12)."""
    lp1, (lpt, ent) = LOGPROBS(model, joined.tokens)
    tgt = joined.tokens[:, 1:, None]
    ref1 = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tgt, -1)[..., 0]
    np.testing.assert_allclose(lp1, ref1, atol=1e-5)
    logq = jax.nn.log_softmax(logits[:, :-1] / TEMP)
    np.testing.assert_allclose(lpt, jnp.take_along_axis(logq, tgt, -1)[..., 0], atol=1e-5)
    np.testing.assert_allclose(ent, -jnp.sum(jnp.exp(logq) * logq, -1), atol=1e-5)
    assert float(jnp.min(ent)) > 0 and float(jnp.max(ent)) <= np.log(64) + 1e-5
    # RL re-scoring: completion terms of the joined sequence == the sampler's greedy log-probs
    mask = joined.completion_mask[:, 1:]
    np.testing.assert_allclose(jnp.where(mask, lp1, 0.0), joined.logprobs[:, 1:], atol=1e-5)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_entropy(model, joined.tokens, temperature=0.0)


def test_stop_tokens_and_per_sequence_lengths(model, greedy):
    # stop sequence 0 on its 3rd greedy token; give sequence 2 a budget of 2 tokens (same shapes: no recompile)
    stop = jnp.array([[int(greedy.tokens[0, 2])], [-1], [-1]])
    out = sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY, stop_tokens=stop, max_new_tokens=jnp.array([N, N, 2]))
    first = int(np.argmax(np.asarray(greedy.tokens[0]) == int(greedy.tokens[0, 2])))
    assert list(np.asarray(out.lengths)) == [first + 1, N, 2]
    np.testing.assert_array_equal(out.tokens[0, : first + 1], greedy.tokens[0, : first + 1])
    assert np.all(np.asarray(out.tokens[0, first + 1 :]) == 0) and np.all(np.asarray(out.logprobs[2, 2:]) == 0)
    np.testing.assert_array_equal(out.tokens[1], greedy.tokens[1])
    j = out.join(PROMPTS, LENS)
    np.testing.assert_array_equal(j.completion_mask.sum(1), out.lengths)


def test_sampling_logprobs_filters():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    p = jnp.exp(sampling_logprobs(logits, 1.0, top_k=2))
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], atol=1e-6)
    p = jnp.exp(sampling_logprobs(logits, 1.0, top_p=0.7))  # smallest prefix with mass >= 0.7: 2 tokens
    np.testing.assert_allclose(p, [[0.625, 0.375, 0, 0]], atol=1e-6)
    p = jnp.exp(sampling_logprobs(logits, 0.5))
    np.testing.assert_allclose(p, jax.nn.softmax(2 * logits), atol=1e-6)


def test_sampled_logprobs_are_of_sampled_tokens(model):
    cfg = SamplerConfig(max_new_tokens=N, temperature=0.8, top_k=10)
    out = sample_joined(model, PROMPTS, LENS, jax.random.PRNGKey(2), cfg)
    lp = out.logprobs[out.completion_mask]
    assert out.tokens.shape == (3, 12) and lp.shape == (3 * N,) and np.all(np.asarray(lp) <= 0)
    assert np.all(np.asarray(lp) > np.log(1e-6))  # never a filtered (-inf) token
    again = sample_joined(model, PROMPTS, LENS, jax.random.PRNGKey(2), cfg)
    np.testing.assert_array_equal(out.tokens, again.tokens)
    # existing configs unchanged by min-p and stop sequences: recorded with the sampler before they were added
    np.testing.assert_array_equal(out.tokens, [[23, 31, 21, 38, 21, 13, 36, 61, 1, 51, 1, 51],
                                               [37, 36, 4, 33, 44, 53, 29, 51, 19, 0, 0, 0],
                                               [14, 61, 42, 8, 35, 58, 35, 3, 19, 12, 12, 0]])
    np.testing.assert_allclose(lp[:6], [-2.367180824279785, -2.3686089515686035, -2.1815836429595947,
                                        -2.241992235183716, -2.1708006858825684, -2.235539197921753], rtol=1e-6)


@pytest.fixture(scope="module")
def rows_mesh():
    return make_mesh("data=3", jax.devices()[:3])  # one device per prompt row


def test_data_parallel_greedy_equals_single_device(model, greedy, rows_mesh):
    out = sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY, mesh=rows_mesh)
    assert len(out.tokens.sharding.device_set) == 3
    np.testing.assert_array_equal(out.tokens, greedy.tokens)
    np.testing.assert_array_equal(out.lengths, greedy.lengths)
    np.testing.assert_allclose(out.logprobs, greedy.logprobs, atol=1e-5)
    joined = sample_joined(model, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY, mesh=rows_mesh)
    np.testing.assert_array_equal(joined.tokens, greedy.join(PROMPTS, LENS).tokens)


def test_data_parallel_sampling_draws_with_the_shard_key(model, rows_mesh):
    """Shard s samples its rows with fold_in(key, s): row s equals a single-device run with that key."""
    cfg = SamplerConfig(max_new_tokens=N, temperature=TEMP)
    key = jax.random.PRNGKey(3)
    out = sample(model, PROMPTS, LENS, key, cfg, mesh=rows_mesh)
    for s in (0, 2):
        ref = sample(model, PROMPTS[s : s + 1], LENS[s : s + 1], jax.random.fold_in(key, s), cfg)
        np.testing.assert_array_equal(out.tokens[s], ref.tokens[0])


def test_data_parallel_bad_mesh(model):
    with pytest.raises(ValueError, match="not divisible"):
        sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY, mesh=make_mesh("data=2", jax.devices()[:2]))
    with pytest.raises(ValueError, match="no axis 'data'"):
        sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), GREEDY, mesh=make_mesh("tensor=3", jax.devices()[:3]))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_group_prefill_draws_as_one_prefill_per_row(scan_layers):
    """generate(group=g): each prompt prefilled once, its cache shared by its g rows: the same tokens as
    prefilling every row (sampling, same key) and log-probs within float tolerance; rows not whole groups refused."""
    from jaxrl_reason.models.lm.sampler import generate

    m = Transformer(dataclasses.replace(CFG, scan_layers=scan_layers), rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(m)
    g = 4
    prompts, lens = jnp.repeat(PROMPTS, g, axis=0), jnp.repeat(LENS, g)
    b = prompts.shape[0]
    cfg = SamplerConfig(max_new_tokens=N, temperature=1.0)
    args = (prompts, lens, jax.random.PRNGKey(3), jnp.full((b, 1), 2, jnp.int32), jnp.full((b,), N, jnp.int32))
    every = generate(graphdef, state, *args, config=cfg)
    shared = generate(graphdef, state, *args, config=cfg, group=g)
    np.testing.assert_array_equal(shared.tokens, every.tokens)
    np.testing.assert_array_equal(shared.lengths, every.lengths)
    np.testing.assert_allclose(shared.logprobs, every.logprobs, rtol=1e-5, atol=1e-6)
    assert len({tuple(r) for r in np.asarray(every.tokens)}) > 3  # the group's rows decode apart
    with pytest.raises(ValueError, match="whole groups"):
        generate(graphdef, state, *args, config=cfg, group=5)
