"""rl/grpo/recipes.py: ``ARCHS`` (the gpu presets' policies) and ``PolicySource``, every experiment's one policy
loader."""

import jax
import pytest
from flax import nnx

from jaxrl_reason.models.lm import Transformer
from jaxrl_reason.models.tokenizer import HFTokenizer


@pytest.fixture(scope="module")
def tok():
    return HFTokenizer.train_bpe(["what is 1 plus 2? <think>3</think><answer>3</answer>"] * 8, 120,
                                 special_tokens=("<pad>", "<bos>", "<eos>"))


def test_archs_are_the_named_models_and_policy_source_checks_its_name():
    """recipes.ARCHS (the gpu presets' policies without --model) build, abstractly, with the parameter counts of
    the models they are named after; an unknown name is refused."""
    from jaxrl_reason.rl.grpo.recipes import ARCHS, PolicySource

    expected = {"qwen2.5-0.5b": 0.494e9, "qwen3-0.6b": 0.596e9, "r1-distill-qwen-1.5b": 1.777e9, "llama-3.2-1b": 1.236e9}
    assert set(ARCHS) == set(expected)
    for name, params in expected.items():
        model = nnx.eval_shape(lambda: PolicySource(arch=name, max_seq_len=256).build(None, 0, remat=True))
        count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
        assert abs(count - params) / params < 2e-3, (name, count)
        assert (model.cfg.max_seq_len, model.cfg.dtype, model.cfg.remat) == (256, "bfloat16", True)
    with pytest.raises(ValueError, match="unknown arch 'qwen9'"):
        PolicySource(arch="qwen9")


def test_policy_source_builds_the_checkpoint_or_a_fresh_tiny_model(tok, tmp_path):
    """``PolicySource.build``, every experiment's one policy loader: the checkpoint as ``load_hf_model`` loads it
    (window ``max_seq_len``), else a fresh model of the tiny config seeded by ``seed``."""
    from jaxrl_reason.models.lm.hf_import import load_hf_model
    from jaxrl_reason.rl.grpo.recipes import PolicySource, TinyLM
    from testutil import states_equal, tiny_hf_checkpoint

    tiny = TinyLM(d_model=16, n_layers=1, n_heads=2, d_ff=32).config(tok.vocab_size)
    assert states_equal(PolicySource().build(tiny, 3), Transformer(tiny, rngs=nnx.Rngs(3)))
    assert not states_equal(PolicySource().build(tiny, 3), PolicySource().build(tiny, 4))
    ckpt = tiny_hf_checkpoint(tmp_path / "ckpt", tok)
    model = PolicySource(model=str(ckpt), max_seq_len=64).build(tiny, 0)
    assert model.cfg.max_seq_len == 64 and model.cfg.d_model == 32
    assert states_equal(model, load_hf_model(ckpt, max_seq_len=64))
