"""Sampler on imported-size checkpoints: top-k / top-p / min-p against a numpy reference, stop
sequences in the jitted loop, no [B, T, V] prompt logits at a 152k vocabulary, and the default path
unchanged."""

import jax
import jax.extend as jex
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sampler import (SamplerConfig, _choose, generate, prepare, sample, sample_joined,
                                            sampling_logprobs, stop_sequence_array)

CFG = LMConfig(vocab_size=64, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True, tie_embeddings=True)
PROMPTS = jax.random.randint(jax.random.PRNGKey(0), (3, 6), 1, 64)
LENS = jnp.array([6, 3, 5])
N = 8
LOGITS = np.random.default_rng(0).normal(0.0, 2.0, (4, 50)).astype(np.float32)


def ref_logprobs(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """numpy: temperature, then top-k, top-p (smallest most-likely prefix with mass >= top_p), min-p."""
    out = []
    for x in logits.astype(np.float64) / temperature:
        keep = np.ones(x.shape, bool)
        if top_k:
            keep &= x >= np.sort(x)[-top_k]
        if top_p < 1.0:
            p = np.where(keep, np.exp(x - x.max()), 0.0)
            order = np.argsort(-p)
            cum = np.cumsum(p[order] / p.sum())
            n_keep = int(np.searchsorted(cum, top_p) + 1)
            keep &= x >= x[order[n_keep - 1]]
        if min_p > 0.0:
            p = np.where(keep, np.exp(x - x.max()), 0.0)
            keep &= p >= min_p * p.max()
        z = np.log(np.sum(np.exp(x[keep] - x.max()))) + x.max()
        out.append(np.where(keep, x - z, -np.inf))
    return np.stack(out)


FILTERS = [dict(top_k=5), dict(top_p=0.8), dict(min_p=0.1), dict(top_k=20, top_p=0.9, min_p=0.05),
           dict(top_k=3, min_p=0.5), dict(top_p=0.6, min_p=0.2)]


@pytest.mark.parametrize("filters", FILTERS)
def test_filters_match_numpy_reference(filters):
    cfg = SamplerConfig(temperature=0.7, **filters)
    lp = np.asarray(jax.jit(cfg.logprobs)(jnp.asarray(LOGITS)))
    ref = ref_logprobs(LOGITS, 0.7, **filters)
    np.testing.assert_array_equal(np.isfinite(lp), np.isfinite(ref))  # the set of tokens that can be drawn
    np.testing.assert_allclose(lp[np.isfinite(lp)], ref[np.isfinite(ref)], atol=1e-5)
    assert 0 < np.isfinite(lp).sum(1).min() and np.isfinite(lp).sum(1).max() < 50  # every filter removes some


def test_drawn_tokens_follow_the_reported_logprobs():
    """`_choose` draws only kept tokens, with the frequencies exp(logprobs) it reports."""
    cfg = SamplerConfig(temperature=0.7, top_k=20, top_p=0.9, min_p=0.05)
    logits = jnp.asarray(np.repeat(LOGITS[:1], 4000, 0))
    tok, lp = jax.jit(lambda k, x: _choose(k, x, cfg))(jax.random.PRNGKey(0), logits)
    ref = ref_logprobs(LOGITS[:1], 0.7, 20, 0.9, 0.05)[0]
    assert np.all(np.isfinite(ref[np.asarray(tok)]))
    np.testing.assert_allclose(lp, ref[np.asarray(tok)], atol=1e-5)
    freq = np.bincount(np.asarray(tok), minlength=50) / len(tok)
    np.testing.assert_allclose(freq, np.exp(ref), atol=0.03)


def test_min_p_validation_and_greedy_ignores_filters():
    with pytest.raises(ValueError, match="min_p"):
        SamplerConfig(min_p=1.5)
    greedy = SamplerConfig(temperature=0.0, top_k=2, min_p=0.5)
    np.testing.assert_array_equal(greedy.logprobs(jnp.asarray(LOGITS)), jax.nn.log_softmax(jnp.asarray(LOGITS)))
    # min_p = 0 is the old computation, op for op
    np.testing.assert_array_equal(SamplerConfig(temperature=0.7, top_k=5, top_p=0.8).logprobs(jnp.asarray(LOGITS)),
                                  sampling_logprobs(jnp.asarray(LOGITS), 0.7, 5, 0.8))


@pytest.fixture(scope="module")
def model():
    return Transformer(CFG, rngs=nnx.Rngs(0))


# all filters on; the key stream does not depend on stopping, so stopped rows are prefixes of unstopped ones
SAMPLED = SamplerConfig(max_new_tokens=N, temperature=0.9, top_k=16, top_p=0.95, min_p=0.02)


@pytest.fixture(scope="module")
def unstopped(model):
    return sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), SAMPLED)


def test_rescoring_with_the_config_matches_the_sampler(model, unstopped):
    """RL re-scoring: a full forward of the joined sequences through `SamplerConfig.logprobs` gives
    the sampler's log-probs of the sampled tokens (filters included)."""
    j = unstopped.join(PROMPTS, LENS)
    logits = nnx.jit(lambda m, t: m(t)[0])(model, j.tokens)
    lp = jnp.take_along_axis(SAMPLED.logprobs(logits[:, :-1]), j.tokens[:, 1:, None], -1)[..., 0]
    mask = j.completion_mask[:, 1:]
    assert np.all(np.isfinite(np.asarray(lp)[np.asarray(mask)]))
    np.testing.assert_allclose(jnp.where(mask, lp, 0.0), j.logprobs[:, 1:], atol=1e-5)


def first_stop(tokens, seqs):
    """numpy: generated length at the first step whose generated suffix equals one of seqs (else len)."""
    for t in range(len(tokens)):
        if any(t + 1 >= len(q) and list(tokens[t + 1 - len(q) : t + 1]) == list(q) for q in seqs):
            return t + 1
    return len(tokens)


def test_stop_sequences_end_rows_in_the_jitted_loop(model, unstopped):
    g = np.asarray(unstopped.tokens)
    assert len(set(g[0])) > 3
    per_row = [
        [list(g[0, 2:5]), [63, 63, 63, 63]],  # 3 tokens ending at step 4 (or earlier occurrence)
        [[int(PROMPTS[1, 2]), int(g[1, 0])], list(g[1, 1:3])],  # the first straddles the prompt: never matches
        [[int(g[2, 5])], [99]],  # a single token behaves as a stop token
    ]
    seqs = jnp.asarray([[[-1] * (4 - len(q)) + q for q in r] for r in per_row])  # [B=3, Q=2, L=4]
    out = sample(model, PROMPTS, LENS, jax.random.PRNGKey(1), SAMPLED, stop_sequences=seqs)
    want = [first_stop(g[b], per_row[b]) for b in range(3)]
    assert want[0] <= 5 and want[1] <= 3 and want[2] <= 6
    np.testing.assert_array_equal(out.lengths, want)
    for b in range(3):
        np.testing.assert_array_equal(out.tokens[b, : want[b]], g[b, : want[b]])  # stop sequence included
        assert np.all(np.asarray(out.tokens[b, want[b] :]) == 0) and np.all(np.asarray(out.logprobs[b, want[b] :]) == 0)
    # the same sequences for every row (strings through an encoder), with a stop token; same shapes: no recompile
    enc = {"ab": [int(g[0, 3]), int(g[0, 4])]}
    joined = sample_joined(model, PROMPTS, LENS, jax.random.PRNGKey(1), SAMPLED, stop_tokens=[int(g[1, 1])],
                           stop_sequences=stop_sequence_array(["ab", [7, 7, 7, 7]], encode=enc.__getitem__))
    want = [min(first_stop(g[b], [enc["ab"], [7, 7, 7, 7]]), first_stop(g[b], [[int(g[1, 1])]])) for b in range(3)]
    np.testing.assert_array_equal(joined.lengths, want)
    np.testing.assert_array_equal(joined.completion_mask.sum(1), want)


def test_stop_sequence_validation():
    np.testing.assert_array_equal(stop_sequence_array([[1, 2, 3], [4]], batch=2)[1], [[1, 2, 3], [-1, -1, 4]])
    with pytest.raises(ValueError, match="encode"):
        stop_sequence_array(["</answer>"])
    with pytest.raises(ValueError, match="non-empty"):
        stop_sequence_array([[]])


BIG = LMConfig(vocab_size=152_064, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, tie_embeddings=True)


def _shapes(jaxpr):
    """Every intermediate shape in a (closed) jaxpr and its sub-jaxprs."""
    for eqn in jaxpr.eqns:
        yield from (v.aval.shape for v in eqn.outvars)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if isinstance(sub, jex.core.ClosedJaxpr):
                    yield from _shapes(sub.jaxpr)
                elif isinstance(sub, jex.core.Jaxpr):
                    yield from _shapes(sub)


def test_prefill_has_no_batch_time_vocab_logits():
    """vocab 152_064: no [B, P, V] value is traced or allocated; greedy == argmax of the full forward."""
    model = nnx.jit(lambda: Transformer(BIG, rngs=nnx.Rngs(0)))()
    b, p, n, v = 2, 32, 4, BIG.vocab_size
    prompts = jax.random.randint(jax.random.PRNGKey(0), (b, p), 0, v)
    lens = jnp.array([p, 20])
    cfg = SamplerConfig(max_new_tokens=n, temperature=0.0)
    graphdef, state = nnx.split(model)
    args = prepare(BIG, prompts, lens, cfg)
    call = (graphdef, state, *args[:2], jax.random.PRNGKey(0), *args[2:])
    shapes = set(_shapes(jax.make_jaxpr(lambda *a: generate(*a, config=cfg), static_argnums=(0,))(*call).jaxpr))
    assert (b, v) in shapes and not [s for s in shapes if np.prod(s) >= b * p * v]  # (the embedding is [V, 16])
    compiled = generate.lower(*call, config=cfg).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes  # 2.4 MB here; full prompt logits: 39 MB more
    assert temp < b * p * v * 4 // 4, temp

    out = compiled(*call[1:])
    toks = jnp.concatenate([prompts, jnp.zeros((b, n), jnp.int32)], 1)
    for r in range(b):  # write each row's completion right after its prompt, then one full forward
        toks = toks.at[r, int(lens[r]) : int(lens[r]) + n].set(out.tokens[r])
    logits = nnx.jit(lambda m, t: m(t)[0])(model, toks)
    for r in range(b):
        lg = logits[r, int(lens[r]) - 1 : int(lens[r]) - 1 + n]
        np.testing.assert_array_equal(np.asarray(jnp.argmax(lg, -1)), np.asarray(out.tokens[r]))
        lp = jnp.take_along_axis(jax.nn.log_softmax(lg), out.tokens[r][:, None], 1)[:, 0]
        np.testing.assert_allclose(lp, out.logprobs[r], atol=1e-5)
