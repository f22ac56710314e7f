"""models.lm.sequences: join, masks, eos cut, response log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
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
