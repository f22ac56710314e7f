"""DeepSeek-V3 import / export against transformers' DeepseekV3ForCausalLM on tiny random checkpoints
made here (fp32): MLA with and without q_lora_rank, interleaved and plain RoPE, YaRN with mscale,
first_k_dense_replace, grouped sigmoid routing with a non-zero e_score_correction_bias."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from jaxrl_reason.models.lm import load_hf_model, save_hf_model  # noqa: E402
from jaxrl_reason.models.lm.hf_import import HFImportError, config_from_hf  # noqa: E402
from jaxrl_reason.models.lm.model import init_cache  # noqa: E402
from jaxrl_reason.models.lm.sharding import batch_sharding  # noqa: E402
from jaxrl_reason.parallel.mesh import make_mesh  # noqa: E402
from testutil import greedy_tokens, hf_logits, model_logits, rel_error, states_equal  # noqa: E402

V, T, NEW, E = 128, 12, 6, 8  # prompt T - NEW: the greedy buffer has the shape of TOKS (no recompile)
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
        "mscale_all_dim": 0.8, "beta_fast": 32, "beta_slow": 1, "rope_theta": 10000.0}
CASES = {  # q_lora_rank set + YaRN + interleaved RoPE; full-rank q + plain RoPE, not interleaved, unnormalised
    # top-k weights, two shared experts, tied embeddings
    "qlora_yarn": dict(q_lora_rank=24, rope_parameters=YARN, rope_interleave=True),
    "fullq_plain": dict(q_lora_rank=None, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                        rope_interleave=False, norm_topk_prob=False, n_shared_experts=2, tie_word_embeddings=True),
}


def _hf_model(case, layers=3):
    cfg = transformers.DeepseekV3Config(
        **{**dict(n_shared_experts=1, norm_topk_prob=True, tie_word_embeddings=False), **CASES[case]},
        vocab_size=V, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=E, num_experts_per_tok=2,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, first_k_dense_replace=1,
        kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12, max_position_embeddings=64,
        num_nextn_predict_layers=0, num_hidden_layers=layers)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # HF initialises norms to ones
                p.normal_(1.0, 0.2)
            elif name.endswith("gate.weight"):  # decisive routing
                p.normal_(0.0, 0.3)
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0.0, 0.05)
    return model


_CACHE = {}


def _case(case, tmp_path_factory):
    """(HF model, its checkpoint dir, our import), made once per case."""
    if case not in _CACHE:
        hf = _hf_model(case)
        path = tmp_path_factory.mktemp(case)
        hf.save_pretrained(path)
        _CACHE[case] = hf, path, load_hf_model(path)
    return _CACHE[case]


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tmp_path_factory):
    return (request.param,) + _case(request.param, tmp_path_factory)


TOKS = np.random.default_rng(0).integers(0, V, (2, T))


def test_import_logits_and_greedy_match(case):
    name, hf, _, ours = case
    cfg = ours.cfg
    assert cfg.moe_first_dense == 1 and cfg.attention == "mla" and ours.dense_blocks is not None
    yarn = name == "qlora_yarn"
    assert (cfg.q_lora_rank == 24) == yarn and (cfg.rope_scaling is not None) == yarn and cfg.moe_norm_topk == yarn
    assert cfg.mla_rope_interleave == yarn and cfg.tie_embeddings == (not yarn)
    ref = hf_logits(hf, TOKS)
    rel = rel_error(model_logits(ours, jnp.asarray(TOKS)), ref)
    print(f"deepseek_v3 {name}: import max relative logits error {rel:.2e}")
    assert rel <= 1e-3, rel
    bias = ours.blocks.mlp.bias[...]  # the imported correction bias steers the routing: without it logits differ
    assert np.array_equal(np.asarray(bias[1]), hf.model.layers[2].mlp.gate.e_score_correction_bias.numpy())
    ours.blocks.mlp.bias[...] = jnp.zeros_like(bias)
    try:
        assert rel_error(model_logits(ours, jnp.asarray(TOKS)), ref) > 1e-2
    finally:
        ours.blocks.mlp.bias[...] = bias
    if name != "qlora_yarn":  # greedy once (compile time); the logits above cover the other case
        return
    prompt = TOKS[:, : T - NEW]
    with torch.no_grad():
        want = hf.generate(torch.tensor(prompt), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                           eos_token_id=None)[:, T - NEW:].numpy()
    np.testing.assert_array_equal(greedy_tokens(ours, prompt, NEW), want)


@nnx.jit
def _cached(model, toks, positions, cache):
    return model(toks, positions, cache)[:2]


def test_cached_decode_matches_full_forward(tmp_path_factory):
    """Prefill + one-token decode through the KV cache (scanned dense and MoE stacks) equals the full pass."""
    _, _, ours = _case("qlora_yarn", tmp_path_factory)
    full = np.asarray(model_logits(ours, jnp.asarray(TOKS)))
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (2, T))
    a, cache = _cached(ours, jnp.asarray(TOKS[:, :-1]), pos[:, :-1], init_cache(ours.cfg, 2, T))
    b, _ = _cached(ours, jnp.asarray(TOKS[:, -1:]), pos[:, -1:], cache)
    np.testing.assert_allclose(np.concatenate([a, b], axis=1), full, rtol=1e-4, atol=1e-4)


def test_sharded_load_and_expert_parallel_forward(tmp_path_factory):
    """Loaded straight onto an expert/fsdp/tensor mesh (dense and MoE stacks, kv_b, experts sharded):
    the same parameters, and the forward under the mesh (all-to-all expert dispatch) matches HF."""
    hf, path, ours = _case("qlora_yarn", tmp_path_factory)
    mesh = make_mesh("expert=2,fsdp=2,tensor=2")
    sharded = load_hf_model(path, mesh=mesh)
    w = sharded.blocks.mlp.w_up[...]
    assert len(w.sharding.device_set) == 8 and w.addressable_shards[0].data.shape[1] == E // 2
    assert states_equal(sharded, ours)
    graphdef, state = nnx.split(sharded)
    with jax.set_mesh(mesh):
        toks = jax.device_put(jnp.asarray(TOKS), batch_sharding(mesh, TOKS.shape))
        got = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x)[0])(state, toks)
    assert rel_error(got, hf_logits(hf, TOKS)) <= 1e-3


def test_export_round_trip(tmp_path, tmp_path_factory):
    hf, _, ours = _case("qlora_yarn", tmp_path_factory)
    out = save_hf_model(ours, tmp_path / "export")
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "deepseek_v3" and written["rope_parameters"]["rope_type"] == "yarn"
    back = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    rel = rel_error(hf_logits(back, TOKS), hf_logits(hf, TOKS))
    print(f"deepseek_v3: export max relative logits error {rel:.2e}")
    assert rel <= 1e-3, rel
    again = load_hf_model(out)
    assert again.cfg == ours.cfg and states_equal(again, ours)


@pytest.mark.parametrize("change, message", [
    (dict(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}), "'quantization_config'"),
    (dict(scoring_func="softmax"), "'scoring_func' = 'softmax'"),
    (dict(topk_method="greedy"), "'topk_method' = 'greedy'"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}), "rope_parameters.rope_type = 'llama3'"),
    (dict(rope_parameters={**YARN, "factor": None}), "required field 'rope_parameters.factor' is missing"),
    (dict(num_key_value_heads=2), "'num_key_value_heads' must equal"),
    (dict(kv_lora_rank=None), "required field 'kv_lora_rank' is missing"),
    (dict(first_k_dense_replace=3), "'first_k_dense_replace' must be an integer in \\[0, num_hidden_layers\\), got 3"),
])
def test_unsupported_fields_are_named(tmp_path_factory, change, message):
    _, path, _ = _case("qlora_yarn", tmp_path_factory)
    hf = {**json.loads((path / "config.json").read_text()), **change}
    with pytest.raises(HFImportError, match=message):
        config_from_hf(hf, source="ck/config.json")


def test_a_wrong_shape_in_a_late_layer_and_expert_is_named(tmp_path, tmp_path_factory):
    from safetensors.numpy import load_file, save_file

    _, path, _ = _case("qlora_yarn", tmp_path_factory)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((path / "config.json").read_text())
    tensors = load_file(path / "model.safetensors")
    name = "model.layers.2.mlp.experts.5.up_proj.weight"
    tensors[name] = tensors[name][:, :-1].copy()
    save_file(tensors, bad / "model.safetensors")
    with pytest.raises(HFImportError, match=f"{name} \\(model.safetensors\\) has shape \\(32, 63\\), expected \\(32, 64\\)"):
        load_hf_model(bad)


def _mtp_checkpoint(tmp_path, tmp_path_factory):
    """qlora_yarn's checkpoint plus an MTP layer 3 (a random MoE decoder layer, taken from a 4-layer HF
    model, and random enorm / hnorm / eh_proj / shared_head.norm, with copies of embed and head) ->
    (HF model, HF model whose layers[3] is the MTP block, MTP tensors, dir)."""
    from safetensors.numpy import load_file, save_file

    hf, path, _ = _case("qlora_yarn", tmp_path_factory)
    hf4 = _hf_model("qlora_yarn", layers=4)
    hf4.save_pretrained(tmp_path / "hf4")
    tensors = load_file(path / "model.safetensors")
    hf4_tensors = load_file(tmp_path / "hf4" / "model.safetensors")
    extra = {n: a for n, a in hf4_tensors.items() if n.startswith("model.layers.3.")}
    rng = np.random.default_rng(1)
    mtp = {"enorm.weight": rng.normal(1, 0.2, 64), "hnorm.weight": rng.normal(1, 0.2, 64),
           "eh_proj.weight": rng.normal(0, 0.1, (64, 128)), "shared_head.norm.weight": rng.normal(1, 0.2, 64)}
    mtp = {k: v.astype(np.float32) for k, v in mtp.items()}
    extra |= {f"model.layers.3.{k}": v for k, v in mtp.items()}
    extra |= {"model.layers.3.embed_tokens.weight": tensors["model.embed_tokens.weight"],
              "model.layers.3.shared_head.head.weight": tensors["lm_head.weight"]}
    out = tmp_path / "mtp"
    out.mkdir()
    hf_cfg = json.loads((path / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**hf_cfg, "num_nextn_predict_layers": 1}))
    save_file(tensors | extra, out / "model.safetensors")
    return hf, hf4, mtp, out


def _torch_mtp_logits(hf, hf4, mtp, toks):
    """DeepSeek-V3 MTP (as vLLM's DeepSeekMTP): logits for token t+2 [B, T-1, V] from the final-normed
    hidden h_t and emb(tok_{t+1}): lm_head(norm(layer(eh_proj([enorm(emb); hnorm(h)]))))."""
    rms = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3RMSNorm
    with torch.no_grad():
        enorm, hnorm, snorm = (rms(64, hf.config.rms_norm_eps) for _ in range(3))
        for mod, k in ((enorm, "enorm.weight"), (hnorm, "hnorm.weight"), (snorm, "shared_head.norm.weight")):
            mod.weight.copy_(torch.from_numpy(mtp[k]))
        t = torch.tensor(toks)
        h = hf.model(t).last_hidden_state[:, :-1]  # after the final norm
        e = hf.model.embed_tokens(t[:, 1:])
        x = torch.cat([enorm(e), hnorm(h)], -1) @ torch.from_numpy(mtp["eh_proj.weight"]).T
        pos = torch.arange(x.shape[1])[None].expand(x.shape[0], -1)
        mask = torch.full((x.shape[1],) * 2, torch.finfo(torch.float32).min).triu(1)[None, None]
        x = hf4.model.layers[3](x, attention_mask=mask, position_ids=pos,
                                position_embeddings=hf.model.rotary_emb(x, pos))
        x = x[0] if isinstance(x, tuple) else x
        return hf.lm_head(snorm(x)).numpy()


def test_mtp_layer_import_matches_torch_reference_and_round_trips(tmp_path, tmp_path_factory):
    """An MTP layer (model.layers.{num_hidden_layers}.*) imports as mtp_layout='deepseek': its logits
    (and sft_loss's MTP NLL) match a torch reference built from transformers' modules; the export
    writes it back under layer 3 and re-imports bit-identically; mtp_depth=0 skips the layer."""
    from safetensors.numpy import load_file

    from jaxrl_reason.models.lm.train import sft_loss

    hf, hf4, mtp, path = _mtp_checkpoint(tmp_path, tmp_path_factory)
    ours = load_hf_model(path)
    assert ours.cfg.mtp_depth == 1 and ours.cfg.mtp_layout == "deepseek"
    ref = _torch_mtp_logits(hf, hf4, mtp, TOKS)
    got = jax.jit(lambda toks: ours.mtp_logits(ours.mtp_hidden(ours.hidden(toks)[0], toks)[0]))(jnp.asarray(TOKS))
    rel = rel_error(got, ref)
    print(f"deepseek_v3 MTP: import max relative logits error {rel:.2e}")
    assert rel <= 1e-3, rel
    _, met = jax.jit(lambda toks: sft_loss(ours, toks, jnp.ones((2, T - 1))))(jnp.asarray(TOKS))
    lp = torch.log_softmax(torch.from_numpy(ref[:, :-1]), -1).gather(-1, torch.tensor(TOKS[:, 2:, None]))
    assert np.isclose(float(met["mtp_nll"]), -lp.mean().item(), rtol=1e-4)

    out = save_hf_model(ours, tmp_path / "export")
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1
    assert np.array_equal(load_file(out / "model.safetensors")["model.layers.3.eh_proj.weight"], mtp["eh_proj.weight"])
    assert states_equal(load_hf_model(out), ours)
    assert states_equal(load_hf_model(path, mtp_depth=0), _case("qlora_yarn", tmp_path_factory)[2])


def test_mtp_config_without_tensors_or_too_deep(tmp_path, tmp_path_factory):
    """num_nextn_predict_layers=1 without the layer's tensors: imported without MTP, with a warning;
    2 MTP layers are refused (mtp_depth=0 imports without them)."""
    import shutil

    _, path, ours = _case("qlora_yarn", tmp_path_factory)
    hf = json.loads((path / "config.json").read_text())
    for n in (1, 2):
        (tmp_path / str(n)).mkdir()
        (tmp_path / str(n) / "config.json").write_text(json.dumps({**hf, "num_nextn_predict_layers": n}))
    shutil.copy(path / "model.safetensors", tmp_path / "1")
    with pytest.warns(UserWarning, match="num_nextn_predict_layers=1 but the checkpoint has no model.layers.3.eh_proj"):
        again = load_hf_model(tmp_path / "1")
    assert again.cfg.mtp_depth == 0 and states_equal(again, ours)
    with pytest.raises(HFImportError, match="mtp_depth must be one of \\(0, 1\\), got 2"):
        config_from_hf({**hf, "num_nextn_predict_layers": 2})


def test_native_mla_moe_model_exports_to_deepseek_v3(tmp_path):
    """A model of the project's own MLA / MoE config (grouped routing, dense first layer, learned bias)
    exports as deepseek_v3 and transformers reproduces its logits."""
    from jaxrl_reason.models.lm import LMConfig, Transformer

    cfg = LMConfig(vocab_size=64, d_model=32, n_layers=3, n_heads=4, d_ff=64, attention="mla", kv_lora_rank=16,
                   q_lora_rank=16, qk_nope_dim=8, qk_rope_dim=4, v_head_dim=8, n_routed_experts=8, moe_top_k=2,
                   moe_d_ff=16, moe_n_groups=4, moe_topk_groups=2, moe_route_scale=1.5, moe_first_dense=1)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    model.blocks.mlp.router[...] = model.blocks.mlp.router[...] * 10
    model.blocks.mlp.bias[...] = 0.01 * jax.random.normal(jax.random.PRNGKey(3), model.blocks.mlp.bias[...].shape)
    out = save_hf_model(model, tmp_path / "native")
    assert json.loads((out / "config.json").read_text())["model_type"] == "deepseek_v3"
    back = transformers.AutoModelForCausalLM.from_pretrained(out).float().eval()
    toks = TOKS % cfg.vocab_size
    assert rel_error(model_logits(model, jnp.asarray(toks)), hf_logits(back, toks)) <= 1e-3
    assert states_equal(load_hf_model(out), model)
