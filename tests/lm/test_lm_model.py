"""Model, attention (GQA / MLA naive vs absorbed), cache and config validation."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer, cache_bytes_per_token, init_cache
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample

MLA = LMConfig(vocab_size=128, d_model=48, n_heads=4, attention="mla", kv_lora_rank=24, q_lora_rank=16,
               qk_nope_dim=8, qk_rope_dim=4, v_head_dim=12, mla_absorbed=False)
GQA = LMConfig(vocab_size=128, d_model=32, n_heads=4, n_kv_heads=2, qkv_bias=True)
TOKS = jax.random.randint(jax.random.PRNGKey(0), (2, 10), 0, 128)


@pytest.fixture(scope="module")
def mla_pair():
    naive = Transformer(MLA, rngs=nnx.Rngs(0))
    absorbed = Transformer(dataclasses.replace(MLA, mla_absorbed=True), rngs=nnx.Rngs(1))
    nnx.update(absorbed, nnx.state(naive))
    return naive, absorbed


def test_mla_absorbed_equals_naive(mla_pair):
    naive, absorbed = mla_pair
    fwd = nnx.jit(lambda m, t: m(t)[0])
    a, b = fwd(naive, TOKS), fwd(absorbed, TOKS)
    assert float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(a))) < 1e-5


def test_mla_cache_bytes_per_token():
    cache = init_cache(MLA, 3, 20)
    per_layer = MLA.kv_lora_rank + MLA.qk_rope_dim
    assert cache_bytes_per_token(cache) == MLA.n_layers * per_layer * 4
    assert MLA.cache_values_per_token() == MLA.n_layers * per_layer
    gqa = init_cache(GQA, 3, 20)
    assert cache_bytes_per_token(gqa) == GQA.n_layers * 2 * GQA.n_kv_heads * GQA.hd * 4


def test_incremental_decode_matches_full_forward(mla_pair):
    """MLA absorbed, compressed cache: prefill 6 tokens then 4 single-token steps == one full forward.
    (GQA's cache path is covered by the sampler's greedy == argmax-of-full-forward test.)"""
    model, cfg = mla_pair[1], mla_pair[1].cfg
    full = nnx.jit(lambda m, t: m(t)[0])(model, TOKS)
    cache = init_cache(cfg, 2, 16)
    step = nnx.jit(lambda m, t, p, c: m(t, p, c))
    outs = []
    lg, cache, _ = step(model, TOKS[:, :6], jnp.broadcast_to(jnp.arange(6), (2, 6)), cache)
    outs.append(lg)
    for i in range(6, 10):
        lg, cache, _ = step(model, TOKS[:, i : i + 1], jnp.full((2, 1), i), cache)
        outs.append(lg)
    np.testing.assert_allclose(np.asarray(jnp.concatenate(outs, 1)), np.asarray(full), atol=2e-5)


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(d_model=30, n_heads=4), "divisible by n_heads"),
        (dict(n_heads=4, n_kv_heads=3), "multiple of n_kv_heads"),
        (dict(n_routed_experts=4, moe_top_k=5), "moe_top_k"),
        (dict(n_routed_experts=6, moe_n_groups=4), "divisible by moe_n_groups"),
        (dict(n_routed_experts=8, moe_n_groups=4, moe_topk_groups=1, moe_top_k=4), "not enough experts"),
        (dict(attention="mha"), "attention must be"),
        (dict(attention="mla", qk_rope_dim=3), "even"),
        (dict(mtp_depth=2), "mtp_depth"),
    ],
)
def test_bad_configs_raise(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LMConfig(**kw)


def test_cache_too_short_raises_before_compile():
    model = nnx.eval_shape(lambda: Transformer(GQA, rngs=nnx.Rngs(0)))  # abstract: nothing runs
    with pytest.raises(ValueError, match="KV cache too short"):
        sample(model, TOKS, None, jax.random.PRNGKey(0), SamplerConfig(max_new_tokens=8, cache_len=12))
    with pytest.raises(ValueError, match="max_seq_len"):
        sample(model, TOKS, None, jax.random.PRNGKey(0), SamplerConfig(max_new_tokens=1000))
