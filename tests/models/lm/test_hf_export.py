"""HF import + export of the dense families (qwen2, qwen3, llama with llama3 RoPE scaling, mistral with a
sliding window), against transformers on tiny random checkpoints made here (fp32)."""

import dataclasses
import json
import os
import shutil

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
from jaxrl_reason.models.tokenizer import HFTokenizer  # noqa: E402
from jaxrl_reason.parallel.mesh import make_mesh  # noqa: E402
from testutil import greedy_tokens, hf_logits, model_logits, rel_error, smollm2_hf_checkpoint, states_equal  # noqa: E402

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


# ---- exports are drop-in replacements: special ids, generation config, tokenizer files (issue 46) ----

MAX_NEW = 8
#: config.json / generation_config.json fields an export may write differently from its source, and why
MAY_DIFFER = {
    "dtype": "the stored weights' dtype: save_hf_model's dtype argument",
    "torch_dtype": "the same, under its transformers < 5 name",
    "quantization_config": "dropped: the exported weights are plain floats",
    "auto_map": "dropped: transformers' own class of the family runs the export, not the source's remote code",
}


def _generate(path, prompt, max_new=MAX_NEW):
    """Greedy continuations [B, <= max_new] of a checkpoint in transformers, its generation config otherwise
    (on one torch thread: decoding SmolLM2 is 4x faster than on two on the shared 2-core machine)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(path).float().eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            out = hf.generate(torch.tensor(prompt), attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                              max_new_tokens=max_new, do_sample=False)
    finally:
        torch.set_num_threads(threads)
    return out[:, prompt.shape[1]:].numpy()


_CHAT = {}


def _chat_checkpoint(kind, tmp_path_factory):
    """(directory, prompt) of `_make_chat_checkpoint`, made once per family."""
    if kind not in _CHAT:
        _CHAT[kind] = _make_chat_checkpoint(kind, tmp_path_factory)
    return _CHAT[kind]


def _make_chat_checkpoint(kind, tmp_path_factory):
    """A tiny random checkpoint of ``kind`` as an instruct model ships (Qwen-style): a word-level tokenizer
    saved by transformers (ChatML template in chat_template.jinja, eos <|im_end|>, pad <|endoftext|>),
    config.json with the special ids and generation_config.json with eos [<|im_end|>, <|endoftext|>] and
    sampling defaults. <|im_end|> is the token the model greedily writes early in row 0 of the prompt,
    the other specials ids it never writes; returns (directory, prompt [2, P])."""
    import copy

    from tokenizers import Tokenizer, models, pre_tokenizers

    from jaxrl_reason.rl.grpo.start import CHATML

    if kind == "deepseek_v3":
        from .test_hf_deepseek import _case

        hf = _case("qlora_yarn", tmp_path_factory)[0]
    else:
        hf = _family(kind, tmp_path_factory)[0]
    prompt = TOKS[:, : T - NEW]
    with torch.no_grad():
        free = hf.generate(torch.tensor(prompt), attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                           max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0).numpy()
    row = free[0, T - NEW:].tolist()
    im_end = row[next((j for j in range(1, MAX_NEW - 1) if row[j] not in row[:j]), 0)]
    endoftext, im_start = [i for i in range(V) if i not in free[:, T - NEW:]][:2]
    words = {f"w{i}": i for i in range(V)}
    specials = {"<|endoftext|>": endoftext, "<|im_start|>": im_start, "<|im_end|>": im_end}
    for name, i in specials.items():
        words[name] = words.pop(f"w{i}")
    tk = Tokenizer(models.WordLevel(words, unk_token=next(w for w in words if w.startswith("w"))))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.add_special_tokens(list(specials))
    path = tmp_path_factory.mktemp(f"chat-{kind}")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                         chat_template=CHATML, model_max_length=64).save_pretrained(path)
    hf = copy.deepcopy(hf)
    hf.config.bos_token_id, hf.config.eos_token_id, hf.config.pad_token_id = endoftext, im_end, endoftext
    hf.generation_config = transformers.GenerationConfig(
        bos_token_id=endoftext, eos_token_id=[im_end, endoftext], pad_token_id=endoftext, do_sample=True,
        temperature=0.7, top_p=0.8, top_k=20)
    hf.save_pretrained(path)
    return path, prompt


def _json(path):
    return json.loads(path.read_text())


@pytest.mark.parametrize("kind", FAMILIES + ["deepseek_v3"])
def test_export_generates_as_the_original(kind, tmp_path, tmp_path_factory):
    """load -> export (with and without source) -> transformers generate, greedy, the checkpoint's
    generation config: the original's tokens, stopping at the same eos; with source, config.json and
    generation_config.json equal to the original's on every field (none here is in MAY_DIFFER)."""
    src, prompt = _chat_checkpoint(kind, tmp_path_factory)
    ours, tok = load_hf_model(src), HFTokenizer.from_pretrained(src)
    want = _generate(src, prompt)
    im_end = tok.token_to_id("<|im_end|>")
    stop = want[0].tolist().index(im_end)  # the original stopped row 0 at eos, then padded it
    assert stop < MAX_NEW - 1 and (want[0, stop + 1:] == tok.pad_id).all()
    out = save_hf_model(ours, tmp_path / "export", tok, source=src)
    np.testing.assert_array_equal(_generate(out, prompt), want)
    for name in ("config.json", "generation_config.json"):
        assert _json(out / name) == _json(src / name), name
    assert (out / "chat_template.jinja").read_text() == (src / "chat_template.jinja").read_text()
    assert "chat_template" not in _json(out / "tokenizer_config.json")
    back = transformers.AutoTokenizer.from_pretrained(out)
    chat = [{"role": "user", "content": "w3 w4"}, {"role": "assistant", "content": "w5"}]
    assert back.apply_chat_template(chat, tokenize=False) == \
        transformers.AutoTokenizer.from_pretrained(src).apply_chat_template(chat, tokenize=False)
    assert (back.eos_token, back.pad_token, back.model_max_length) == ("<|im_end|>", "<|endoftext|>", 64)
    # no source: the tokenizer's ids, eos = <|im_end|> (also the template's end of turn): the same stop
    bare = save_hf_model(ours, tmp_path / "bare", tok)
    np.testing.assert_array_equal(_generate(bare, prompt), want)
    assert _json(bare / "generation_config.json") == {"eos_token_id": im_end, "pad_token_id": tok.pad_id}
    assert {k: _json(bare / "config.json").get(k) for k in hf_export.TOKEN_IDS} == \
        {"bos_token_id": None, "eos_token_id": im_end, "pad_token_id": tok.pad_id}


def test_export_keeps_the_source_but_for_what_the_model_changed(tmp_path, tmp_path_factory):
    """Only MAY_DIFFER fields and those the LMConfig changed (here max_seq_len, overridden at load) differ
    from the source; a source without generation_config.json gets transformers' one derived from its
    config; the export may replace its own source; a Mistral source without a window stays mistral."""
    src, _ = _chat_checkpoint("llama3", tmp_path_factory)
    tok = HFTokenizer.from_pretrained(src)
    d = tmp_path / "src"
    shutil.copytree(src, d)
    orig = _json(src / "config.json")
    (d / "config.json").write_text(json.dumps({**orig, "auto_map": {"AutoModelForCausalLM": "x.Y"},
                                               "quantization_config": {"quant_method": "gguf"}}))
    (d / "generation_config.json").unlink()
    out = save_hf_model(load_hf_model(d, max_seq_len=32), d, tok, source=d, dtype="bfloat16", overwrite=True)
    cfg = _json(out / "config.json")
    changed = {k for k in set(cfg) | set(orig) if cfg.get(k) != orig.get(k)}
    assert changed - set(MAY_DIFFER) == {"max_position_embeddings"} and cfg["max_position_embeddings"] == 32
    assert cfg["dtype"] == "bfloat16" and "torch_dtype" not in cfg and "auto_map" not in cfg
    assert _json(out / "generation_config.json") == {"_from_model_config": True, **{
        k: orig[k] for k in hf_export.TOKEN_IDS}}
    assert _json(save_hf_model(load_hf_model(out), tmp_path / "again", source=out)
                 / "config.json")["dtype"] == "bfloat16"  # dtype=None: the source's
    # mistral, sliding_window null: the LMConfig has no window (export_model_type: llama), the source's type kept
    _, path, _ = _family("mistral", tmp_path_factory)
    m = tmp_path / "mistral"
    m.mkdir()
    (m / "config.json").write_text(json.dumps({**_json(path / "config.json"), "sliding_window": None}))
    (m / "model.safetensors").symlink_to(path / "model.safetensors")
    model = load_hf_model(m)
    assert hf_export.export_model_type(model.cfg) == "llama"
    written = _json(save_hf_model(model, tmp_path / "m-out", source=m) / "config.json")
    assert written == _json(m / "config.json")
    with pytest.raises(HFImportError, match="not a checkpoint directory"):
        save_hf_model(model, tmp_path / "x", source=tmp_path / "nowhere")


def test_end_of_turn_id():
    from jaxrl_reason.models.lm.hf_export import end_of_turn_id
    from jaxrl_reason.models.tokenizer import ByteTokenizer
    from jaxrl_reason.rl.grpo.start import CHATML

    chatml = ByteTokenizer(extra_special=("<|im_start|>", "<|im_end|>"), chat_template=CHATML)
    assert end_of_turn_id(chatml) == chatml.token_to_id("<|im_end|>")
    for template in (None, "{{ raise_exception('no') }}", "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"):
        assert end_of_turn_id(ByteTokenizer(chat_template=template)) is None


def test_start_checkpoint_export_stops_at_im_end(tmp_path):
    """The built-in start (rl.grpo.start): its tokenizer's eos is ChatML's <|im_end|>, so the export's
    config and generation config stop transformers' generate there, as the project's sampler stops."""
    from jaxrl_reason.rl.grpo.start import StartConfig, start_model_config, start_tokenizer
    from testutil import constant_model

    cfg = StartConfig(tokenizer_corpus=200)
    tok = start_tokenizer(cfg)
    im_end = tok.token_to_id("<|im_end|>")
    assert tok.stops()[0].tolist() == [im_end]  # the sampler's stop
    model = nnx.merge(*constant_model(start_model_config(cfg, tok.vocab_size), im_end))
    out = save_hf_model(model, tmp_path / "start", tok)
    assert _json(out / "generation_config.json") == {"bos_token_id": tok.bos_id, "eos_token_id": im_end,
                                                       "pad_token_id": tok.pad_id}
    prompt = np.asarray([tok.apply_chat_template([{"role": "user", "content": "1+2-3"}], add_generation_prompt=True,
                                                 tokenize=True)])
    assert _generate(out, prompt).tolist() == [[im_end]]


@pytest.mark.slow
def test_smollm2_export_generates_as_the_original(tmp_path):
    """A real chat checkpoint (config bos 1 / eos 2 / pad 2, a generation config, chat_template.jinja): the
    export answers a chat prompt with the original's tokens and stops at <|im_end|> as it does."""
    src = smollm2_hf_checkpoint()  # transformers' conversion of the GGUF file, as a user would make it
    ours, tok = load_hf_model(src), HFTokenizer.from_pretrained(src)
    chat = [{"role": "user", "content": "What is 3 + 4?"}]
    prompt = np.asarray([tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)])
    out = save_hf_model(ours, tmp_path / "export", tok, source=src)
    want, got = (_generate(d, prompt, max_new=64) for d in (src, out))
    assert want[0, -1] == tok.eos_id == tok.token_to_id("<|im_end|>") and want.shape[1] < 64
    np.testing.assert_array_equal(got, want)
    for name in ("config.json", "generation_config.json", "chat_template.jinja"):
        assert (out / name).read_text() == (src / name).read_text() if name.endswith("jinja") else \
            _json(out / name) == _json(src / name), name
