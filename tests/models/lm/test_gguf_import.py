"""Differential tests of the GGUF import (`gguf_import`) against transformers' own GGUF loading: tiny files
written here for llama / qwen2 / qwen3 / mistral (random weights in F32, F16, BF16 and seven quantised types,
tiny BPE vocabularies, a ChatML template), and the real SmolLM2-135M-Instruct Q4_1 file (slow)."""

import json
import pathlib

import jax
import numpy as np
import pytest
from flax import nnx

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

from testutil import hf_logits, model_logits, rel_error, smollm2_gguf, smollm2_hf_checkpoint  # noqa: E402

from jaxrl_reason.models.lm import HFImportError, load_hf_model, load_model, save_hf_model  # noqa: E402
from jaxrl_reason.models.lm.gguf_import import GGUFFile, gguf_tokenizer, load_gguf_model  # noqa: E402
from jaxrl_reason.models.lm.sampler import SamplerConfig, sample  # noqa: E402
from jaxrl_reason.models.tokenizer import HFTokenizer  # noqa: E402
from jaxrl_reason.parallel.mesh import make_mesh  # noqa: E402

Q = gguf.GGMLQuantizationType
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Name a colour: blue, green, red or yellow!",
          "What is 12 + 345? It is 357.", "Write a haiku about the sea.\n  Indent   this, please.",
          "You are a helpful assistant; answer briefly.", "user assistant system"] * 4
CHATS = [
    [{"role": "user", "content": "What is 12 + 345?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another one, please!"}],
    [{"role": "user", "content": "Write a haiku about the sea.\n  Indent   this."}],
]
D, LAYERS, HEADS, KV, FF = 64, 2, 4, 2, 256  # FF = 256: the K-quants' block
#: head dim: D // HEADS, but qwen3's own (attention.key_length; 128: transformers ignores the key and takes
#: Qwen3Config's default)
HEAD_DIM = {"qwen3": 128}
#: tensor kind -> GGML type, per architecture (norms and biases are F32, as llama.cpp writes them);
#: no "output": tied embeddings
PLANS = {
    "llama": dict(embd=Q.F16, q=Q.Q8_0, k=Q.Q8_0, v=Q.Q4_0, o=Q.Q4_0, gate=Q.Q4_1, up=Q.Q4_1, down=Q.Q4_K,
                  output=Q.Q4_0),
    "qwen2": dict(embd=Q.Q8_0, q=Q.BF16, k=Q.BF16, v=Q.BF16, o=Q.BF16, gate=Q.Q5_0, up=Q.Q5_1, down=Q.Q6_K),
    "qwen3": dict(embd=Q.F32, q=Q.F16, k=Q.F16, v=Q.F16, o=Q.F16, gate=Q.Q8_0, up=Q.Q8_0, down=Q.Q4_K, output=Q.Q8_0),
    "mistral": dict(embd=Q.F32, q=Q.F32, k=Q.F32, v=Q.F32, o=Q.F32, gate=Q.F32, up=Q.F32, down=Q.F32),
}
_K_SCALES = {Q.Q4_K: ((0, 1e-3), (2, 1e-3)), Q.Q6_K: ((208, 2e-4),)}  # byte offset of each f16 scale, its value


# ---------------------------------------------------------------- writing tiny GGUF files


def _bpe_vocab() -> dict:
    """Byte-level BPE (ChatML specials first) as tokenizer.ggml.* metadata."""
    tk = HFTokenizer.train_bpe(CORPUS, 320, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                               eos="<|im_end|>", pad="<|endoftext|>", bos="<|im_start|>").tk
    vocab = tk.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    merges = [" ".join(m) if isinstance(m, list) else m for m in json.loads(tk.to_str())["model"]["merges"]]
    return dict(model="gpt2", tokens=tokens, types=[3] * 3 + [1] * (len(tokens) - 3), merges=merges,
                bos=1, eos=2, pad=0, add_bos=False)


def _spm_vocab() -> dict:
    """SentencePiece BPE (Mistral / Llama 2 style: <unk> <s> </s>, 256 byte tokens, '▁' pieces scored by rank,
    no merges in the file) plus the ChatML control tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.Metaspace()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=150, show_progress=False))
    vocab = tk.get_vocab()
    pieces = sorted(vocab, key=vocab.get)
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    return dict(model="llama", tokens=tokens, types=[2, 3, 3, 3, 3] + [6] * 256 + [1] * len(pieces),
                scores=[0.0] * 261 + [-float(i) for i in range(len(pieces))], bos=1, eos=4, add_bos=True)


def _tensor(rng, shape, qtype):
    """Random weights [out, in] stored as ``qtype`` (K-quants: random blocks with small f16 scales)."""
    if qtype == Q.I8:
        return rng.integers(-8, 8, shape, dtype=np.int8)
    if qtype in _K_SCALES:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (shape[0], shape[1] // block, size), dtype=np.uint8)
        for at, value in _K_SCALES[qtype]:
            raw[..., at:at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
        return raw.reshape(shape[0], -1)
    scale = 1.0 if len(shape) == 1 else 0.3
    return gguf.quants.quantize((rng.normal(0, scale, shape) + (len(shape) == 1)).astype(np.float32), qtype)


def write_gguf(path, arch: str, vocab: dict, plan: dict, name: str | None = None, pre: str | None = None,
               weights: dict | None = None, theta: float | None = None) -> pathlib.Path:
    """A tiny GGUF as llama.cpp's converter writes it (metadata, tokenizer, tensors named blk.N.*), random
    weights unless ``weights`` (GGUF name -> float32 [out, in]; more tensors as F32) gives them; pre:
    tokenizer.ggml.pre (default: the one of the architecture); theta: rope.freq_base."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(name or arch)
    for add, value in (("context_length", 128), ("embedding_length", D), ("block_count", LAYERS),
                       ("feed_forward_length", FF), ("head_count", HEADS), ("head_count_kv", KV),
                       ("layer_norm_rms_eps", 1e-6), ("rope_freq_base", theta or (1e4 if arch == "llama" else 1e6))):
        getattr(w, f"add_{add}")(value)
    hd = HEAD_DIM.get(arch, D // HEADS)
    if arch == "llama":
        w.add_rope_dimension_count(hd)
    if hd != D // HEADS:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_tokenizer_model(vocab["model"])
    if vocab["model"] == "gpt2":
        w.add_tokenizer_pre(pre or {"llama": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2"}.get(arch, "default"))
    w.add_token_list(vocab["tokens"])
    w.add_token_types(vocab["types"])
    if "merges" in vocab:
        w.add_token_merges(vocab["merges"])
    if "scores" in vocab:
        w.add_token_scores(vocab["scores"])
    w.add_bos_token_id(vocab["bos"])
    w.add_eos_token_id(vocab["eos"])
    if "pad" in vocab:
        w.add_pad_token_id(vocab["pad"])
    w.add_add_bos_token(vocab["add_bos"])
    w.add_chat_template(CHATML)

    rng, v = np.random.default_rng(0), len(vocab["tokens"])
    shapes = {"embd": (v, D), "output": (v, D), "q": (HEADS * hd, D), "k": (KV * hd, D), "v": (KV * hd, D),
              "o": (D, HEADS * hd), "gate": (FF, D), "up": (FF, D), "down": (D, FF)}
    tensors = {"token_embd.weight": ("embd", None), "output_norm.weight": (None, (D,))}
    if "output" in plan:
        tensors["output.weight"] = ("output", None)
    gg = dict(q="attn_q", k="attn_k", v="attn_v", o="attn_output", gate="ffn_gate", up="ffn_up", down="ffn_down")
    for i in range(LAYERS):
        tensors |= {f"blk.{i}.{g}.weight": (kind, None) for kind, g in gg.items()}
        tensors |= {f"blk.{i}.attn_norm.weight": (None, (D,)), f"blk.{i}.ffn_norm.weight": (None, (D,))}
        if arch == "qwen2":
            tensors |= {f"blk.{i}.attn_{p}.bias": (None, (n * hd,)) for p, n in (("q", HEADS), ("k", KV), ("v", KV))}
        if arch == "qwen3":
            tensors |= {f"blk.{i}.attn_{p}_norm.weight": (None, (hd,)) for p in "qk"}
    tensors |= {tname: (None, None) for tname in set(weights or ()) - set(tensors)}
    for tname, (kind, shape) in tensors.items():
        qtype = plan[kind] if kind else Q.F32
        data = _tensor(rng, shape or shapes[kind], qtype) if tname not in (weights or {}) else \
            gguf.quants.quantize(weights[tname], qtype)
        w.add_tensor(tname, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)


# ---------------------------------------------------------------- tiny files, one per architecture


def _chat_ids(tok, chat):
    """Ids of a chat prompt from our HFTokenizer or a transformers tokenizer."""
    if isinstance(tok, HFTokenizer):
        return tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    out = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _source(kind: str, vocab_size: int, **config):
    """A random HF ``kind`` ("Mistral" or "Llama"; the tiny sizes, tied, random norms, weights large enough for
    attention to depend on positions) and its weights as llama.cpp's converter writes them: gguf-py's own
    tensor names, q/k rows permuted as its ``LlamaModel.permute``, and with llama3 RoPE the divisor of each
    frequency as ``rope_freqs.weight``."""
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{kind}Config")(
        vocab_size=vocab_size, hidden_size=D, intermediate_size=FF, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
        num_key_value_heads=KV, rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.2, **config)
    hf = getattr(transformers, f"{kind}ForCausalLM")(cfg).eval()
    names, weights = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, LAYERS), {}
    for key, t in hf.named_parameters():
        if "norm" in key:
            with torch.no_grad():
                t.normal_(1.0, 0.1)
        a = t.detach().numpy()
        heads = HEADS if ".q_proj." in key else KV if ".k_proj." in key else None
        if heads:
            a = a.reshape(heads, 2, a.shape[0] // heads // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        base, suffix = key.rsplit(".", 1)
        weights[f"{names.get_name(base)}.{suffix}"] = a.astype(np.float32)
    if cfg.rope_parameters["rope_type"] == "llama3":  # transformers' scaled frequencies vs plain RoPE's
        hd, theta = D // HEADS, cfg.rope_parameters["rope_theta"]
        plain = 1.0 / theta ** (np.arange(0, hd, 2) / hd)
        weights["rope_freqs.weight"] = (plain / hf.model.rotary_emb.inv_freq.double().numpy()).astype(np.float32)
    return hf, weights


_TINY = {}


def _tiny(kind: str, tmp_path_factory):
    """(arch, file, our model, our tokenizer, reference model, transformers tokenizer), made once per kind. The
    reference is transformers' GGUF loading, but for mistral: gguf-py has no mistral architecture, which
    transformers needs for a mistral GGUF's tensors, so there it is the HF Mistral the file is written from."""
    if kind not in _TINY:
        path = tmp_path_factory.mktemp(kind) / f"{kind}.gguf"
        if kind == "mistral":  # llama.cpp writes Mistral as llama, named "mistral"; SentencePiece vocab; F32
            vocab = _spm_vocab()
            hf, weights = _source("Mistral", len(vocab["tokens"]), rope_theta=10000.0, sliding_window=None)
            write_gguf(path, "llama", vocab, PLANS[kind], name=kind, weights=weights)
        else:
            write_gguf(path, kind, _bpe_vocab(), PLANS[kind])
            hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).eval()
        hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        assert hf.config.model_type == kind and hf.dtype == torch.float32
        _TINY[kind] = kind, path, load_model(path), gguf_tokenizer(path), hf, hf_tok
    return _TINY[kind]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral"])
def tiny(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory)


def test_tiny_logits_and_chat_ids(tiny):
    """Each architecture and GGML type as transformers reads it: logits within 1e-5 (float32), the same ids
    for chat prompts and plain text, the same config features."""
    kind, _, ours, tok, hf, hf_tok = tiny
    assert (ours.cfg.qkv_bias, ours.cfg.qk_norm, ours.cfg.tie_embeddings) == (
        kind == "qwen2", kind == "qwen3", "output" not in PLANS[kind])
    toks = np.random.default_rng(0).integers(0, ours.cfg.vocab_size, (2, 16))
    assert rel_error(model_logits(ours, toks), hf_logits(hf, toks)) < 1e-5
    for chat in CHATS:
        assert _chat_ids(tok, chat) == _chat_ids(hf_tok, chat)
    for text in CORPUS[:5]:
        assert tok.encode(text) == hf_tok.encode(text, add_special_tokens=False)
    assert (tok.bos, tok.eos, tok.add_bos_token) == (hf_tok.bos_token, hf_tok.eos_token, kind == "mistral")


def test_tiny_export_loads_in_transformers(tiny, tmp_path):
    """save_hf_model writes an ordinary checkpoint: transformers gives our logits and chat ids from it."""
    kind, _, ours, tok, _, _ = tiny
    out = save_hf_model(ours, tmp_path / "export", tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    assert hf.config.model_type == {"mistral": "llama"}.get(kind, kind)  # no sliding window: the same as llama
    toks = np.random.default_rng(1).integers(0, ours.cfg.vocab_size, (2, 16))
    assert rel_error(model_logits(ours, toks), hf_logits(hf, toks)) < 1e-5
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert all(_chat_ids(tok, c) == _chat_ids(hf_tok, c) for c in CHATS)


def test_sharded_gguf_load_matches(tmp_path):
    """Devices reading slices of permuted (llama q/k) and quantised rows give the unsharded model."""
    path = write_gguf(tmp_path / "llama.gguf", "llama", _bpe_vocab(), PLANS["llama"])
    f = GGUFFile(path)
    sharded = load_gguf_model(f, make_mesh("data=2,fsdp=2,tensor=2"))
    q = sharded.blocks.attn.q_proj.kernel[...]
    assert len(q.sharding.device_set) > 1 and q.addressable_shards[0].data.shape != q.shape
    toks = np.random.default_rng(0).integers(0, sharded.cfg.vocab_size, (2, 12))
    assert rel_error(model_logits(sharded, toks), np.asarray(model_logits(load_gguf_model(f), toks))) < 1e-5


def test_a_file_is_parsed_once_per_process_until_it_changes(tmp_path, monkeypatch):
    """Loading a model and then its tokenizer reads the file's metadata once; a rewritten file is read anew."""
    import gguf

    path = write_gguf(tmp_path / "model.gguf", "llama", _bpe_vocab(), PLANS["llama"])
    real, reads = gguf.GGUFReader, []
    monkeypatch.setattr(gguf, "GGUFReader", lambda p, *a, **k: reads.append(p) or real(p, *a, **k))
    load_model(path), gguf_tokenizer(path)
    a, b = GGUFFile(path), GGUFFile(tmp_path / "." / "model.gguf")
    assert len(reads) == 1 and a.meta is b.meta and a.tensors is b.tensors
    with pytest.raises(TypeError):
        a.meta["general.architecture"] = "qwen2"  # shared between callers: read-only
    write_gguf(path, "qwen2", _bpe_vocab(), PLANS["qwen2"])
    assert GGUFFile(path).get("general.architecture") == "qwen2" and len(reads) == 2


def test_llama3_rope_freqs(tmp_path):
    """Llama 3.1+: llama.cpp stores the llama3 RoPE scaling as rope_freqs.weight, which transformers' GGUF loading
    ignores; the reference is the HF Llama the file is written from. Other divisors are refused."""
    vocab = _bpe_vocab()
    hf, weights = _source("Llama", len(vocab["tokens"]), max_position_embeddings=131072, rope_parameters=dict(
        rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192))
    path = write_gguf(tmp_path / "llama3.gguf", "llama", vocab, PLANS["mistral"], weights=weights, theta=5e5)
    ours = load_model(path)
    assert dict(ours.cfg.rope_scaling)["factor"] == 8.0
    toks = np.random.default_rng(0).integers(0, ours.cfg.vocab_size, (2, 16))
    assert rel_error(model_logits(ours, toks), hf_logits(hf, toks)) < 1e-5
    weights["rope_freqs.weight"][1] *= 1.5
    bad = write_gguf(tmp_path / "bad.gguf", "llama", vocab, PLANS["mistral"], weights=weights, theta=5e5)
    with pytest.raises(HFImportError, match="rope_freqs.weight .* is not Llama 3's llama3 scaling"):
        load_model(bad)


def test_bfloat16_load(tmp_path_factory):
    """dtype: every parameter is the float32 dequantised value rounded to the requested dtype."""
    _, path, ours, *_ = _tiny("qwen2", tmp_path_factory)
    half = load_model(path, dtype="bfloat16")
    assert half.cfg.param_dtype == "bfloat16"
    for a, b in zip(jax.tree.leaves(nnx.state(half)), jax.tree.leaves(nnx.state(ours)), strict=True):
        assert a.dtype == jax.numpy.bfloat16 and np.array_equal(a, b.astype(a.dtype))


def test_unsupported_files_are_one_line_errors(tmp_path):
    """An architecture, tensor type, tokenizer model or pre-tokenizer we do not read: one HFImportError line
    naming it and listing what is supported; a broken file names itself."""
    vocab, plan = _bpe_vocab(), PLANS["qwen2"]
    files = {
        "phi3": write_gguf(tmp_path / "phi3.gguf", "phi3", vocab, plan),
        "i8": write_gguf(tmp_path / "i8.gguf", "qwen2", vocab, {**plan, "gate": Q.I8}),
        "bert": write_gguf(tmp_path / "bert.gguf", "qwen2", {**vocab, "model": "bert"}, plan),
        "pre": write_gguf(tmp_path / "pre.gguf", "qwen2", vocab, plan, pre="bogus"),
    }
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(files["phi3"].read_bytes()[:200])
    cases = [
        (load_model, files["phi3"], r"unsupported GGUF architecture 'phi3'; supported: \('llama', "),
        (load_model, files["i8"], r"unsupported GGUF tensor type\(s\) I8 \(blk.0.ffn_gate.weight\).*; supported: "
                                     r"\('F32', 'F16', 'Q4_0'.*'Q6_K'"),
        (gguf_tokenizer, files["bert"], r"unsupported tokenizer tokenizer.ggml.model='bert'.*; supported: \('gpt2', "),
        (gguf_tokenizer, files["pre"], r"unsupported pre-tokenizer tokenizer.ggml.pre='bogus'; supported: \("),
        (load_model, broken, r"broken.gguf: not a readable GGUF file"),
        (load_hf_model, broken, r"broken.gguf is a llama.cpp GGUF file: load it with jaxrl_reason.models.lm.load_model"),
    ]
    for fn, path, match in cases:
        with pytest.raises(HFImportError, match=match) as e:
            fn(path)
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------- the real SmolLM2-135M-Instruct Q4_1 file

@pytest.fixture(scope="module")
def smollm2():
    """(our model, our tokenizer, transformers model, transformers tokenizer), loaded once; transformers' from its
    own reading of the GGUF file (``testutil.smollm2_hf_checkpoint``: dequantised once per session)."""
    f = GGUFFile(smollm2_gguf())
    hf_path = smollm2_hf_checkpoint()
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_path).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_path)
    return load_gguf_model(f), gguf_tokenizer(f), hf, hf_tok


@pytest.mark.slow
def test_smollm2_logits(smollm2):
    ours, _, hf, _ = smollm2
    toks = np.random.default_rng(0).integers(0, ours.cfg.vocab_size, (2, 24))
    assert rel_error(model_logits(ours, toks), hf_logits(hf, toks)) < 1e-5


@pytest.mark.slow
def test_smollm2_chat_ids_and_greedy(smollm2):
    """Chat-template ids identical; greedy 32 tokens of our sampler (batched, right-padded) identical to
    transformers' generate (one prompt at a time: a left-padded batch is 3x slower there); both stop at eos."""
    ours, tok, hf, hf_tok = smollm2
    prompts = [_chat_ids(tok, c) for c in CHATS]
    assert prompts == [_chat_ids(hf_tok, c) for c in CHATS]
    batch, lens = tok.pad_batch(prompts, max(map(len, prompts)))
    out = sample(ours, batch, lens, jax.random.key(0), SamplerConfig(max_new_tokens=32, temperature=0.0),
                 stop_tokens=[tok.eos_id])
    for p, row, n in zip(prompts, np.asarray(out.tokens), np.asarray(out.lengths)):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False)[0, len(p):].tolist()
        assert row[:n].tolist() == ref


@pytest.mark.slow
def test_smollm2_export(smollm2, tmp_path):
    ours, tok, _, hf_tok = smollm2
    out = save_hf_model(ours, tmp_path / "smollm2", tok)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    toks = np.random.default_rng(2).integers(0, ours.cfg.vocab_size, (1, 16))
    assert rel_error(model_logits(ours, toks), hf_logits(hf, toks)) < 1e-5
    exported = transformers.AutoTokenizer.from_pretrained(out)
    assert all(_chat_ids(exported, c) == _chat_ids(hf_tok, c) for c in CHATS)
