"""models.lm.sequences: join, masks, eos cut, response log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sequences import (
    cut_at_eos, join, response_logprobs, response_mask, response_positions, span_mask)
from jaxrl_reason.models.lm.train import token_logprobs


def test_join_and_positions():
    prompts = np.array([[1, 7, 8, 0], [1, 9, 0, 0]])
    out = join(prompts, np.array([3, 2]), np.array([[4, 5], [6, 0]]))
    assert out.tolist() == [[1, 7, 8, 4, 5, 0], [1, 9, 6, 0, 0, 0]]
    stale = np.array([[1, 7, 8, 3], [1, 9, 3, 3]])  # ids past a prompt's length never reach the sequence
    out = np.asarray(join(stale, np.array([3, 2]), np.array([[4, 5], [6, 2]]), pad_id=2))
    assert out[0, :5].tolist() == [1, 7, 8, 4, 5] and out[1, :4].tolist() == [1, 9, 6, 2]
    assert response_positions(np.array([3, 2]), 2).tolist() == [[2, 3], [1, 2]]


def test_masks():
    assert span_mask(jnp.array([1, 0]), jnp.array([2, 0]), 4).tolist() == [[False, True, True, False]] + [[False] * 4]
    got = response_mask(jnp.array([2, 3, 1]), 3, jnp.array([True, True, False]))
    assert got.dtype == jnp.float32 and got.tolist() == [[1, 1, 0], [1, 1, 1], [0, 0, 0]]
    assert response_mask(jnp.array([0, 1]), 2).tolist() == [[0, 0], [1, 0]]


def test_cut_at_eos():
    eos, pad = 2, 0
    tokens = jnp.array([[5, 6, 2, 0], [5, 6, 7, 8], [2, 0, 0, 0], [5, 6, 7, 2], [5, 2, 9, 9]])
    lengths = jnp.array([3, 4, 1, 4, 1])  # the last row: the eos lies past its length
    content, lens, ended = jax.jit(cut_at_eos, static_argnums=(3, 4))(tokens, lengths, 2, eos, pad)
    assert content.tolist() == [[5, 6, 0], [5, 6, 0], [0, 0, 0], [5, 6, 0], [5, 0, 0]]
    assert lens.tolist() == [2, 2, 0, 2, 1]
    assert ended.tolist() == [True, False, True, False, False]  # no eos / eos after the limit: not ended


def test_response_logprobs_match_full_sequence_logprobs():
    cfg = LMConfig(vocab_size=16, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=16)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    prompts, plens = jnp.array([[1, 3, 4, 0], [1, 5, 0, 0]]), jnp.array([3, 2])
    seqs = join(prompts, plens, jnp.array([[6, 7, 2], [8, 2, 0]]))
    logp, ent = response_logprobs(model, seqs, plens, 3, temperature=1.0, chunk=2)
    full = token_logprobs(model, seqs)  # [B, T-1]
    want = jnp.take_along_axis(full, response_positions(plens, 3), axis=1)
    np.testing.assert_allclose(logp, want, atol=1e-5)
    assert ent.shape == (2, 3) and bool((ent > 0).all())


@pytest.mark.parametrize("kind", ["gqa", "mla_moe", "window_remat"])
def test_grouped_response_logprobs_equal_the_full_pass(kind):
    """group=G (each prompt once, into a shared KV cache) gives the log-probs, entropies and gradients of the
    plain pass over every row's whole sequence; prompts of different lengths in one batch."""
    cfgs = {"gqa": LMConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48, max_seq_len=32,
                            qkv_bias=True, qk_norm=True),
            "mla_moe": LMConfig(vocab_size=32, d_model=48, n_layers=2, n_heads=4, attention="mla", kv_lora_rank=24,
                                q_lora_rank=16, qk_rope_dim=8, qk_nope_dim=8, v_head_dim=8, n_routed_experts=4,
                                moe_top_k=2, moe_d_ff=16, moe_first_dense=1, d_ff=48, max_seq_len=32),
            "window_remat": LMConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=1, d_ff=48,
                                     max_seq_len=32, sliding_window=4, remat=True)}
    model = Transformer(cfgs[kind], rngs=nnx.Rngs(1))
    g, n = 3, 5
    rng = np.random.default_rng(0)
    prompts = np.repeat(rng.integers(1, 32, (2, 6)), g, axis=0)
    plens = np.repeat(np.array([6, 3]), g)
    seqs = join(jnp.asarray(prompts), jnp.asarray(plens), jnp.asarray(rng.integers(1, 32, (2 * g, n))))
    graphdef, params = nnx.split(model)

    def run(p, group):
        logp, ent = response_logprobs(nnx.merge(graphdef, p), seqs, jnp.asarray(plens), n, 0.8, 2, group)
        return jnp.sum(logp * jnp.linspace(0.5, 1.5, n)) + jnp.sum(ent), (logp, ent)

    value_and_grad = jax.jit(jax.value_and_grad(run, has_aux=True), static_argnums=1)
    (v1, (lp1, e1)), g1 = value_and_grad(params, 1)
    (vg, (lpg, eg)), gg = value_and_grad(params, g)
    np.testing.assert_allclose(lpg, lp1, atol=2e-5)
    np.testing.assert_allclose(eg, e1, atol=2e-5)
    for a, b in zip(jax.tree.leaves(gg), jax.tree.leaves(g1)):
        np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="groups of 4"):
        response_logprobs(model, seqs, jnp.asarray(plens), n, 1.0, 2, 4)
