"""HF import faults: a malformed config.json or checkpoint raises one ``HFImportError`` naming the file
and the field or tensor (every layer's tensors are checked). Tiny checkpoints are written here with
``safetensors.numpy``, so these tests need neither torch nor transformers."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from jaxrl_reason.models.lm.hf_import import HFImportError, config_from_hf, load_hf_model

TINY = dict(model_type="llama", vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
            rope_theta=10000.0, tie_word_embeddings=False)


def tensors(cfg=TINY, layers=None) -> dict[str, np.ndarray]:
    """HF-layout ([out, in]) float32 tensors of a Llama checkpoint for ``cfg``."""
    rng = np.random.default_rng(0)
    d, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = d // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(cfg["num_hidden_layers"] if layers is None else layers):
        pre = f"model.layers.{i}."
        shapes |= {pre + "input_layernorm.weight": (d,), pre + "post_attention_layernorm.weight": (d,),
                   pre + "self_attn.q_proj.weight": (q, d), pre + "self_attn.k_proj.weight": (kv, d),
                   pre + "self_attn.v_proj.weight": (kv, d), pre + "self_attn.o_proj.weight": (d, q),
                   pre + "mlp.gate_proj.weight": (f, d), pre + "mlp.up_proj.weight": (f, d),
                   pre + "mlp.down_proj.weight": (d, f)}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def write(path, cfg=TINY, ts=None, config_text=None):
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg) if config_text is None else config_text)
    save_file(tensors(cfg) if ts is None else ts, str(path / "model.safetensors"))
    return path


def test_a_tiny_checkpoint_loads(tmp_path):
    ts = tensors()
    model = load_hf_model(write(tmp_path, ts=ts))
    np.testing.assert_array_equal(np.asarray(model.embed[...]), ts["model.embed_tokens.weight"])
    up = np.asarray(model.blocks.mlp.up.kernel[...])  # [layers, in, out]
    np.testing.assert_array_equal(up[1], ts["model.layers.1.mlp.up_proj.weight"].T)


@pytest.mark.parametrize("text, where", [("{", "line 1, column 2"), ('{"model_type": "llama",\n "vocab_size": 96,,}', "line 2"),
                                         ("", "line 1, column 1")])
def test_invalid_json_names_the_file_and_position(tmp_path, text, where):
    path = write(tmp_path, config_text=text)
    with pytest.raises(HFImportError, match="invalid JSON") as e:
        load_hf_model(path)
    assert str(path / "config.json") in str(e.value) and where in str(e.value)


def test_binary_config_is_reported(tmp_path):
    path = write(tmp_path)
    (path / "config.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(HFImportError, match="config.json"):
        load_hf_model(path)


@pytest.mark.parametrize("field, value, message", [
    ("hidden_size", None, "required field 'hidden_size' is missing"),
    ("hidden_size", "32", "'hidden_size' must be a positive integer, got '32' \\(str\\)"),
    ("num_hidden_layers", [2], "'num_hidden_layers' must be a positive integer, got \\[2\\]"),
    ("intermediate_size", -64, "'intermediate_size' must be a positive integer"),
    ("vocab_size", True, "'vocab_size' must be a positive integer"),
    ("vocab_size", 96.5, "'vocab_size' must be a positive integer"),
    ("num_key_value_heads", 0, "'num_key_value_heads' must be a positive integer"),
    ("rms_norm_eps", "1e-6", "'rms_norm_eps' must be a positive finite number"),
    ("rms_norm_eps", float("nan"), "'rms_norm_eps' must be a positive finite number"),
    pytest.param("rope_theta", 10**400, "'rope_theta' must be a positive finite number", id="rope_theta-huge-int"),
    ("tie_word_embeddings", "false", "'tie_word_embeddings' must be true or false"),
    ("rope_scaling", "linear", "'rope_scaling' must be a JSON object"),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "RoPE scaling type 'yarn'"),
    ("model_type", "gpt2", "unsupported model_type 'gpt2'"),
    ("num_key_value_heads", 3, "n_heads \\(4\\) must be a multiple of n_kv_heads \\(3\\)"),
    ("hidden_size", 30, "d_model \\(30\\) must be divisible by n_heads"),
])
def test_bad_config_fields_name_the_file_and_field(tmp_path, field, value, message):
    cfg = {k: v for k, v in TINY.items() if k != field} if value is None else {**TINY, field: value}
    path = write(tmp_path, cfg, ts=tensors())
    with pytest.raises(HFImportError, match=message) as e:
        load_hf_model(path)
    assert str(path / "config.json") in str(e.value)
    with pytest.raises(HFImportError, match=message):  # the dict API too, naming "config.json"
        config_from_hf(cfg)


def test_config_must_be_an_object():
    with pytest.raises(HFImportError, match="my/config.json: must hold a JSON object, got list"):
        config_from_hf([TINY], source="my/config.json")


def test_a_layer_1_shape_mismatch_is_named(tmp_path):
    ts = tensors()
    ts["model.layers.1.mlp.up_proj.weight"] = ts["model.layers.1.mlp.up_proj.weight"][:, :-1]
    with pytest.raises(HFImportError, match=r"model\.layers\.1\.mlp\.up_proj\.weight \(model\.safetensors\) "
                                            r"has shape \(64, 31\), expected \(64, 32\)") as e:
        load_hf_model(write(tmp_path, ts=ts))
    assert "layers.0" not in str(e.value)


def test_missing_and_unused_tensors_are_named(tmp_path):
    ts = tensors()
    del ts["model.layers.1.self_attn.k_proj.weight"]
    ts["model.layers.1.self_attn.k_norm.weight"] = np.ones(8, np.float32)
    with pytest.raises(HFImportError) as e:
        load_hf_model(write(tmp_path, ts=ts))
    msg = str(e.value)
    assert "missing 1 tensor(s) (not in model.safetensors): model.layers.1.self_attn.k_proj.weight" in msg
    assert "model.layers.1.self_attn.k_norm.weight (model.safetensors) is not a parameter" in msg


def test_more_layers_than_the_config_is_an_error(tmp_path):
    with pytest.raises(HFImportError, match=r"model\.layers\.2\.\S+ \(model\.safetensors\) is not a parameter"):
        load_hf_model(write(tmp_path, ts=tensors(layers=3)))


def test_integer_tensors_are_rejected(tmp_path):
    ts = tensors()
    ts["model.layers.1.mlp.down_proj.weight"] = ts["model.layers.1.mlp.down_proj.weight"].astype(np.int8)
    with pytest.raises(HFImportError, match=r"model\.layers\.1\.mlp\.down_proj\.weight \(model\.safetensors\) has dtype I8"):
        load_hf_model(write(tmp_path, ts=ts))


def test_ignorable_tensors_are_accepted(tmp_path):
    ts = tensors() | {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
    load_hf_model(write(tmp_path, {**TINY, "tie_word_embeddings": True}, ts=ts))  # lm_head.weight saved though tied


@pytest.mark.parametrize("keep", [0, 5, 100, -1])
def test_truncated_safetensors_names_the_file(tmp_path, keep):
    path = write(tmp_path)
    f = path / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: keep if keep >= 0 else len(data) - 1])
    with pytest.raises(HFImportError, match="not a readable safetensors file") as e:
        load_hf_model(path)
    assert str(f) in str(e.value)


def test_a_tensor_in_two_files_is_an_error(tmp_path):
    path = write(tmp_path)
    save_file({"model.norm.weight": np.ones(32, np.float32)}, str(path / "model-extra.safetensors"))
    with pytest.raises(HFImportError, match="'model.norm.weight' is stored twice"):
        load_hf_model(path)


def _word_tokenizer(n_words: int):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n_words)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def test_a_tokenizer_larger_than_the_vocab_is_refused(tmp_path):
    path = write(tmp_path)
    _word_tokenizer(TINY["vocab_size"] + 4).save(str(path / "tokenizer.json"))
    with pytest.raises(HFImportError, match=r"vocab mismatch: .*tokenizer.json has 100 ids but .*config.json says "
                                            r"vocab_size=96"):
        load_hf_model(path)
    _word_tokenizer(90).save(str(path / "tokenizer.json"))  # fewer ids than rows (padded vocab): fine
    load_hf_model(path)
    (path / "tokenizer.json").write_text("{not json")
    with pytest.raises(HFImportError, match="tokenizer.json: not a readable tokenizer file"):
        load_hf_model(path)
