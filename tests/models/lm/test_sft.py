"""models.lm.sft: SFT examples and the one SFT loop, ``fit``."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sft import SFTConfig, draw_rows, fit, sft_examples
from jaxrl_reason.models.tokenizer import CharTokenizer

TOK = CharTokenizer()


def _model():
    return Transformer(LMConfig(vocab_size=TOK.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32,
                                max_seq_len=16), rngs=nnx.Rngs(0))


def test_sft_examples_mask_the_response_targets():
    data = sft_examples([[1, 9], [1, 9, 9]], [[5, 2], [6]], 6, TOK)
    assert data["tokens"].tolist() == [[1, 9, 5, 2, 0, 0], [1, 9, 9, 6, 0, 0]]
    assert data["loss_mask"].tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 0, 0]]  # targets tokens[:, t+1]


def test_draw_rows_from_a_numpy_seed_or_a_jax_key():
    rows = list(draw_rows([3, 1], 5, 4, 3))
    want = np.random.default_rng([3, 1])
    assert all(r.tolist() == want.integers(0, 5, 4).tolist() for r in rows)
    keyed = list(draw_rows(jax.random.key(0), 5, 4, 3))
    assert len(keyed) == 3 and all(k.shape == (4,) and 0 <= int(k.min()) and int(k.max()) < 5 for k in keyed)


def test_fit_learns_in_place_and_returns_the_losses():
    model = _model()
    before = jax.tree.map(np.array, nnx.state(model, nnx.Param))
    data = sft_examples([TOK.encode("ab")] * 4, [TOK.encode("cd") + [TOK.eos_id]] * 4, 8, TOK)
    logged = []
    params, losses = fit(model, data, 30, 4, 1e-2, seed=0, log=lambda i, m: logged.append(i))
    assert losses.shape == (30,) and losses[-1] < 0.5 * losses[0] and logged == list(range(30))
    jax.tree.map(np.testing.assert_array_equal, params, nnx.state(model, nnx.Param))  # the model is the result
    assert not np.allclose(jax.tree.leaves(before)[0], jax.tree.leaves(params)[0])
    with pytest.raises(ValueError, match="mine: need steps"):
        fit(model, {k: v[:0] for k, v in data.items()}, 3, 2, 1e-3, name="mine")


def test_sft_config_validates():
    with pytest.raises(ValueError, match="SFTConfig"):
        SFTConfig(steps=0)
