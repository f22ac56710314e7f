"""Differential tests against HF transformers: tiny random Qwen2 and Llama, saved and imported."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from jaxrl_reason.models.lm.hf_import import load_hf_model  # noqa: E402
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample  # noqa: E402
from jaxrl_reason.parallel.mesh import make_mesh  # noqa: E402

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6)


def _save(tmp_path_factory, kind):
    torch.manual_seed(0)
    if kind == "qwen2":
        cfg = transformers.Qwen2Config(**TINY, tie_word_embeddings=True, rope_theta=1000000.0)
        model = transformers.Qwen2ForCausalLM(cfg)
        with torch.no_grad():  # random (non-zero) qkv biases so the bias path is exercised
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    else:
        cfg = transformers.LlamaConfig(**TINY, tie_word_embeddings=False, rope_theta=10000.0)
        model = transformers.LlamaForCausalLM(cfg)
    model = model.float().eval()
    path = tmp_path_factory.mktemp(kind)
    model.save_pretrained(path, safe_serialization=True)
    return model, path


_LOADED = {}


def _load(tmp_path_factory, kind):
    if kind not in _LOADED:
        hf, path = _save(tmp_path_factory, kind)
        _LOADED[kind] = (hf, path, load_hf_model(path))
    return _LOADED[kind]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def pair(request, tmp_path_factory):
    return _load(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return _load(tmp_path_factory, "qwen2")


def test_logits_match(pair):
    hf, _, ours = pair
    toks = np.random.default_rng(0).integers(0, 96, (2, 12))
    with torch.no_grad():
        ref = hf(torch.tensor(toks)).logits.numpy()
    got = np.asarray(ours(jnp.asarray(toks))[0])
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < 1e-4, rel


def test_greedy_generation_matches(pair):
    hf, _, ours = pair
    prompt = np.random.default_rng(1).integers(0, 96, (2, 5))
    with torch.no_grad():
        ref = hf.generate(torch.tensor(prompt), max_new_tokens=8, do_sample=False, pad_token_id=0)[:, 5:].numpy()
    out = sample(ours, prompt, None, jax.random.PRNGKey(0), SamplerConfig(max_new_tokens=8, temperature=0.0))
    np.testing.assert_array_equal(np.asarray(out.tokens), ref)


def test_sharded_load_matches(qwen2):
    """(One architecture suffices: the loader's sharding path is the same for both.)"""
    _, path, ours = qwen2
    mesh = make_mesh("data=2,fsdp=2,tensor=2")
    sharded = load_hf_model(path, mesh=mesh)
    emb = sharded.embed[...]
    assert len(emb.sharding.device_set) > 1 and emb.addressable_shards[0].data.shape != emb.shape
    toks = jnp.asarray(np.random.default_rng(0).integers(0, 96, (2, 12)))
    np.testing.assert_allclose(np.asarray(sharded(toks)[0]), np.asarray(ours(toks)[0]), rtol=1e-5, atol=1e-5)


def test_bad_checkpoints(qwen2, tmp_path):
    _, path, _ = qwen2
    cfg = json.loads((path / "config.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").symlink_to(path / "model.safetensors")
    (bad / "config.json").write_text(json.dumps({**cfg, "vocab_size": 100}))
    with pytest.raises(ValueError, match="vocab mismatch"):
        load_hf_model(bad)
    with pytest.raises(ValueError, match="vocab mismatch"):
        load_hf_model(path, expected_vocab_size=1000)
    (bad / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    with pytest.raises(ValueError, match="missing .* tensor"):
        load_hf_model(bad)
