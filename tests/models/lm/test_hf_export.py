"""HF import + export of the dense families (qwen2, qwen3, llama with llama3 RoPE scaling, mistral with a
sliding window), against transformers on tiny random checkpoints made here (fp32)."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from jaxrl_reason.models.lm import LMConfig, Transformer, load_hf_model, save_hf_model  # noqa: E402
from jaxrl_reason.models.lm import hf_export  # noqa: E402
from jaxrl_reason.models.lm.hf_import import HFImportError  # noqa: E402
from jaxrl_reason.parallel.mesh import make_mesh  # noqa: E402
from testutil import greedy_tokens, hf_logits, model_logits, rel_error, states_equal  # noqa: E402

V, T, NEW = 128, 12, 6
TINY = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 8.0,
          "original_max_position_embeddings": 64}  # head_dim 8, wavelengths 6, 63, 628, 6283: kept, smoothed, divided
HF_CONFIGS = {
    "qwen2": lambda: transformers.Qwen2Config(**TINY, tie_word_embeddings=False, rope_theta=1e6),
    "qwen3": lambda: transformers.Qwen3Config(**TINY, head_dim=16, tie_word_embeddings=True),
    "llama3": lambda: transformers.LlamaConfig(**TINY, rope_scaling=LLAMA3, rope_theta=10000.0),
    "mistral": lambda: transformers.MistralConfig(**{**TINY, "num_key_value_heads": 1}, sliding_window=5),
}
FAMILIES = list(HF_CONFIGS)


def _hf_model(kind):
    torch.manual_seed(0)
    cfg = HF_CONFIGS[kind]()
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    with torch.no_grad():  # random norms and biases (HF: ones / zeros); larger q/k: peaked attention, so RoPE matters
        for name, p in model.named_parameters():
            if "q_proj.weight" in name or "k_proj.weight" in name:
                p.normal_(0.0, 0.3)
            elif "norm" in name:
                p.normal_(1.0, 0.2)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


_CACHE = {}


def _family(kind, tmp_path_factory):
    """(HF model, its checkpoint dir, our import), made once per family."""
    if kind not in _CACHE:
        hf = _hf_model(kind)
        path = tmp_path_factory.mktemp(kind)
        hf.save_pretrained(path, safe_serialization=True)
        _CACHE[kind] = hf, path, load_hf_model(path)
    return _CACHE[kind]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    return (request.param,) + _family(request.param, tmp_path_factory)


TOKS = np.random.default_rng(0).integers(0, V, (2, T))


def test_import_logits_and_greedy_match(family):
    kind, hf, _, ours = family
    rel = rel_error(model_logits(ours, jnp.asarray(TOKS)), hf_logits(hf, TOKS))
    print(f"{kind}: import max relative logits error {rel:.2e}")
    assert rel <= 1e-3, rel
    prompt = TOKS[:, : T - NEW]  # the buffer of _greedy has TOKS's shape: no second compile
    with torch.no_grad():
        ref = hf.generate(torch.tensor(prompt), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                          eos_token_id=None)[:, T - NEW:].numpy()
    np.testing.assert_array_equal(greedy_tokens(ours, prompt, NEW), ref)


def test_cached_sampling_with_a_sliding_window(tmp_path_factory):
    """The sampler's KV-cache decode masks keys past the window (mistral, window 5 < prompt + generation)."""
    from jaxrl_reason.models.lm.sampler import SamplerConfig, sample

    _, _, ours = _family("mistral", tmp_path_factory)
    prompt = TOKS[:, : T - NEW]
    out = sample(ours, prompt, None, jax.random.PRNGKey(0), SamplerConfig(max_new_tokens=NEW, temperature=0.0))
    np.testing.assert_array_equal(np.asarray(out.tokens), greedy_tokens(ours, prompt, NEW))


def test_export_round_trip(family, tmp_path):
    kind, hf, _, ours = family
    out = save_hf_model(ours, tmp_path / "export")
    back = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    rel = rel_error(hf_logits(back, TOKS), hf_logits(hf, TOKS))
    print(f"{kind}: export ({json.loads((out / 'config.json').read_text())['model_type']}) max rel error {rel:.2e}")
    assert rel <= 1e-3, rel
    again = load_hf_model(out)
    assert again.cfg == ours.cfg and states_equal(again, ours)


def test_sharded_export_and_multi_file_import(tmp_path, tmp_path_factory):
    _, _, ours = _family("qwen3", tmp_path_factory)
    out = save_hf_model(ours, tmp_path / "sharded", max_shard_bytes=20_000)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 2 and sorted(f for f in os.listdir(out) if f.endswith(".safetensors")) == files
    assert states_equal(load_hf_model(out), ours)
    back = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    assert rel_error(hf_logits(back, TOKS), np.asarray(model_logits(ours, jnp.asarray(TOKS)))) <= 1e-3
    # a transformers multi-file checkpoint; then a file its index lists goes missing
    hf, _, _ = _family("llama3", tmp_path_factory)
    multi = tmp_path / "multi"
    hf.save_pretrained(multi, max_shard_size="30KB")
    assert (multi / "model.safetensors.index.json").exists()
    assert rel_error(model_logits(load_hf_model(multi), jnp.asarray(TOKS)), hf_logits(hf, TOKS)) <= 1e-3
    gone = json.loads((multi / "model.safetensors.index.json").read_text())["weight_map"]["model.norm.weight"]
    (multi / gone).unlink()
    with pytest.raises(HFImportError, match=f"index.json: lists 1 file\\(s\\) not in .*{gone}"):
        load_hf_model(multi)


def test_sharded_load_over_a_mesh_and_its_export(tmp_path, tmp_path_factory):
    _, path, ours = _family("qwen3", tmp_path_factory)
    sharded = load_hf_model(path, mesh=make_mesh("data=2,fsdp=2,tensor=2"))
    q = sharded.blocks.attn.q_proj.kernel[...]
    assert len(q.sharding.device_set) > 1 and q.addressable_shards[0].data.shape != q.shape
    assert states_equal(sharded, ours)
    assert states_equal(load_hf_model(save_hf_model(sharded, tmp_path / "from-mesh")), ours)
    np.testing.assert_allclose(model_logits(sharded, jnp.asarray(TOKS)), model_logits(ours, jnp.asarray(TOKS)), rtol=1e-5, atol=1e-5)


def test_native_tiny_model_exports_to_llama(tmp_path):
    from jaxrl_reason.models.tokenizer import CharTokenizer
    from jaxrl_reason.rl.grpo.recipes import TinyLM

    cfg = TinyLM(d_model=32, d_ff=64).config(CharTokenizer().vocab_size)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    out = save_hf_model(model, tmp_path / "tiny", dtype="float32")
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    back = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    toks = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, T))
    assert rel_error(hf_logits(back, toks), np.asarray(model_logits(model, jnp.asarray(toks)))) <= 1e-3
    assert states_equal(load_hf_model(out), model)
    bf16 = save_hf_model(model, tmp_path / "tiny-bf16", dtype="bfloat16")
    assert load_hf_model(bf16).embed[...].dtype == jnp.float32  # stored bf16, loaded in the config's dtype
    assert (bf16 / "model.safetensors").stat().st_size < 0.6 * (out / "model.safetensors").stat().st_size


SMALL = LMConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32)


@pytest.fixture(scope="module")
def small():
    return Transformer(SMALL, rngs=nnx.Rngs(0))


def test_export_refuses_an_existing_path_unless_overwrite(small, tmp_path):
    model = small
    out = tmp_path / "m"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_hf_model(model, out)
    save_hf_model(model, out, overwrite=True)
    assert not (out / "stale.txt").exists() and (out / "config.json").exists()
    assert sorted(os.listdir(tmp_path)) == ["m"]


def test_an_interrupted_export_leaves_nothing(small, tmp_path, monkeypatch):
    model = small
    calls = []
    from safetensors.numpy import save_file

    def failing_save(tensors, filename, metadata=None):  # the second shard's write fails
        calls.append(filename)
        if len(calls) == 2:
            raise OSError("disk full")
        save_file(tensors, filename, metadata=metadata)

    monkeypatch.setattr(hf_export, "save_file", failing_save)
    with pytest.raises(OSError, match="disk full"):
        save_hf_model(model, tmp_path / "m", max_shard_bytes=2_000)
    assert os.listdir(tmp_path) == []
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("old")
    calls.clear()
    with pytest.raises(OSError, match="disk full"):  # an overwrite that fails keeps the old directory
        save_hf_model(model, tmp_path / "m", max_shard_bytes=2_000, overwrite=True)
    assert os.listdir(tmp_path) == ["m"] and os.listdir(tmp_path / "m") == ["keep.txt"]


def test_nan_weights_warn_with_their_name(small, tmp_path):
    model = nnx.clone(small)
    model.blocks.mlp.up.kernel[...] = model.blocks.mlp.up.kernel[...].at[1, 0, 0].set(jnp.nan)
    with pytest.warns(RuntimeWarning, match="blocks/mlp/up/kernel has 1 non-finite"):
        save_hf_model(model, tmp_path / "m")


def test_tokenizer_is_saved_when_given(small, tmp_path):
    model = small

    class Tok:
        def save(self, directory):
            (directory / "tokenizer.json").write_text("{}")

    assert (save_hf_model(model, tmp_path / "m", Tok()) / "tokenizer.json").exists()
    with pytest.raises(TypeError, match="no save\\(directory\\) method"):
        save_hf_model(model, tmp_path / "n", object())
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("change, message", [
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "RoPE scaling type 'yarn'"),
    (dict(rope_scaling={**LLAMA3, "factor": None}), "required field 'rope_scaling.factor' is missing"),
    (dict(attention_bias=True), "attention_bias=true"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    (dict(model_type="qwen3", use_sliding_window=True), "use_sliding_window=true"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor"),
])
def test_unsupported_features_are_named(tmp_path_factory, change, message):
    _, path, _ = _family("llama3", tmp_path_factory)
    hf = json.loads((path / "config.json").read_text())
    hf.pop("rope_parameters", None)
    hf.update(rope_theta=10000.0, rope_scaling=LLAMA3)
    hf.update(change)
    from jaxrl_reason.models.lm.hf_import import config_from_hf

    with pytest.raises(HFImportError, match=message):
        config_from_hf(hf)


def test_configs_without_an_hf_architecture_are_named(small, tmp_path, monkeypatch):
    from jaxrl_reason.models.lm import hf_import

    monkeypatch.delitem(hf_import.FAMILIES, "deepseek_v3", raising=False)  # as if hf_deepseek did not exist
    monkeypatch.setitem(hf_import.LAZY_FAMILIES, "deepseek_v3", "no_such_module_hf_deepseek")
    for change, message in [(dict(fp8=True, fp8_block=16), "fp8=True"),
                            (dict(qk_norm=True, qkv_bias=True), "qkv_bias=True cannot be expressed as model_type 'qwen3'"),
                            (dict(attention="mla"), "attention='mla': only the deepseek_v3 HF architecture")]:
        model = nnx.clone(small)
        model.cfg = dataclasses.replace(SMALL, **change)  # the weights do not matter: refused before they are read
        with pytest.raises(HFImportError, match=message):
            save_hf_model(model, tmp_path / "a")
    assert os.listdir(tmp_path) == []
