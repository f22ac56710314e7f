"""DeepSeek-V3 architecture (HF ``model_type: deepseek_v3``, also Moonlight / Kimi-style configs) for
`hf_import.load_hf_model` and `hf_export.save_hf_model`, registered as the ``deepseek_v3`` family.

Mapping onto our modules (semantics as transformers' DeepseekV3ForCausalLM):
  MLA: q_a_proj / q_a_layernorm / q_b_proj (or q_proj when q_lora_rank is null) -> attn/q_a, q_norm,
    q_b (q_proj); kv_a_proj_with_mqa -> attn/kv_a ([c_kv; k_rope]); kv_a_layernorm -> attn/kv_norm;
    kv_b_proj (per head [k_nope; v]) -> attn/kv_b; ``rope_interleave`` -> LMConfig.mla_rope_interleave.
  RoPE: plain or YaRN (``rope_type: yarn``; cos/sin times its attention_factor and the softmax scale
    times yarn_mscale(factor, mscale_all_dim)^2, see layers.py / attention.py).
  MLP: layers < first_k_dense_replace are dense (LMConfig.moe_first_dense, stacked in ``dense_blocks``),
    the others DeepSeekMoE: gate.weight -> mlp/router, gate.e_score_correction_bias -> mlp/bias (the
    aux-loss-free bias our MoE learns), experts.{e}.* -> mlp/w_gate, w_up, w_down [E, ...],
    shared_experts.* -> mlp/shared; sigmoid scores, grouped top-k (n_group, topk_group),
    norm_topk_prob, routed_scaling_factor; routing is dropless (moe_capacity_factor None).
  MTP (num_nextn_predict_layers = 1, layer N = num_hidden_layers; transformers' DeepseekV3ForCausalLM
    skips it): imported as ``mtp_depth=1, mtp_layout="deepseek"`` (`model.MTP`): enorm -> mtp/norm_e,
    hnorm -> mtp/norm_h, eh_proj -> mtp/proj, shared_head.norm -> mtp/out_norm, the decoder layer's
    self_attn.* / mlp.* -> mtp/block; its embed_tokens and shared_head.head (copies of the model's,
    which the MTP shares) are skipped. A config naming MTP layers whose tensors are absent from the
    checkpoint (read from the directory of ``source``) imports without MTP, with a warning; more than
    one MTP layer is refused by LMConfig (pass ``mtp_depth=0`` to import without them). An export of
    ``mtp_depth=1`` needs ``mtp_layout="deepseek"`` and writes layer N (without the two copies).
Refused with an ``HFImportError`` naming the field: quantization_config (e.g. fp8 weights with
weight_scale_inv), scoring_func other than sigmoid, topk_method other than noaux_tc, hidden_act
other than silu, attention_bias, num_key_value_heads != num_attention_heads, RoPE types other than
default / yarn. HF's q_a_layernorm / kv_a_layernorm use eps 1e-6 whatever rms_norm_eps says; ours use
rms_norm_eps (identical for DeepSeek-V3's 1e-6).
"""

from __future__ import annotations

import math
import pathlib
import re
import warnings


from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.hf_import import (
    HFFamily,
    HFImportError,
    HFTensor,
    _Files,
    hf_field,
    hf_rope,
    register_family,
)

_YARN_OPTIONAL = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor")


def _number(d: dict, key: str, source: str, prefix: str):
    """A finite number >= 0 (or None when absent); ``HFImportError`` naming the field otherwise."""
    v = d.get(key)
    if v is not None and not (type(v) in (int, float) and math.isfinite(v) and v >= 0):
        raise HFImportError(f"{source}: field {prefix + key!r} must be a finite number >= 0, got {v!r}")
    return v


def _has_tensor(root: pathlib.Path, name: str) -> bool | None:
    """Whether the checkpoint in ``root`` holds tensor ``name`` (None: no readable checkpoint there;
    ``load_hf_model`` reports why)."""
    try:
        return name in _Files(root).where
    except HFImportError:
        return None


def config_from_hf(hf: dict, source: str) -> dict:
    """config.json dict of a deepseek_v3 checkpoint -> LMConfig keyword arguments (every field checked)."""
    if hf.get("quantization_config") is not None:
        q = hf["quantization_config"]
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise HFImportError(f"{source}: field 'quantization_config' (quant_method {method!r}) is not supported: "
                            "quantized weights (e.g. fp8 with weight_scale_inv) must be dequantized first")
    for key, ok in (("scoring_func", ("sigmoid",)), ("topk_method", ("noaux_tc",)), ("hidden_act", ("silu",))):
        v = hf.get(key)
        if v is not None and v not in ok:
            raise HFImportError(f"{source}: field {key!r} = {v!r} is not supported (only {ok[0]!r})")
    if hf_field(hf, "attention_bias", "bool", source, False):
        raise HFImportError(f"{source}: field 'attention_bias' = true is not supported")
    def size(key: str, *default):  # a positive integer field; required unless a default is given
        return hf_field(hf, key, "size", source, *default)

    n_heads = size("num_attention_heads")
    if size("num_key_value_heads", n_heads) != n_heads:
        raise HFImportError(f"{source}: field 'num_key_value_heads' must equal num_attention_heads ({n_heads}) for MLA")
    first_dense = hf.get("first_k_dense_replace", 0) or 0
    if type(first_dense) is not int or not 0 <= first_dense < size("num_hidden_layers"):
        raise HFImportError(f"{source}: field 'first_k_dense_replace' must be an integer in [0, num_hidden_layers), "
                            f"got {first_dense!r}")
    theta, rope, rope_key = hf_rope(hf, source)
    rtype = rope.get("rope_type", rope.get("type", "default"))
    if rtype == "yarn":
        scaling = {"rope_type": "yarn",
                   "factor": float(hf_field(rope, "factor", "number", source, prefix=f"{rope_key}.")),
                   "original_max_position_embeddings": hf_field(rope, "original_max_position_embeddings", "size",
                                                                source, prefix=f"{rope_key}."),
                   "truncate": hf_field(rope, "truncate", "bool", source, True, f"{rope_key}.")}
        scaling.update({k: _number(rope, k, source, f"{rope_key}.") for k in _YARN_OPTIONAL})
        scaling = tuple(sorted(scaling.items()))
    elif rtype in ("default", None):
        scaling = None
    else:
        raise HFImportError(f"{source}: field {rope_key}.rope_type = {rtype!r} is not supported (default and 'yarn' are)")
    mtp = hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers")) or 0
    if type(mtp) is not int or mtp < 0:
        raise HFImportError(f"{source}: field 'num_nextn_predict_layers' must be an integer >= 0, got {mtp!r}")
    mtp_name = f"model.layers.{size('num_hidden_layers')}.eh_proj.weight"
    if mtp and _has_tensor(pathlib.Path(source).parent, mtp_name) is False:
        warnings.warn(f"{source}: num_nextn_predict_layers={mtp} but the checkpoint has no {mtp_name}: imported "
                      "without MTP; the model predicts the next token only", stacklevel=4)
        mtp = 0
    q_lora = hf.get("q_lora_rank")
    return dict(
        vocab_size=size("vocab_size"),
        d_model=size("hidden_size"),
        n_layers=size("num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=n_heads,
        d_ff=size("intermediate_size"),
        tie_embeddings=hf_field(hf, "tie_word_embeddings", "bool", source, False),
        rope_theta=theta,
        rope_scaling=scaling,
        norm_eps=float(hf_field(hf, "rms_norm_eps", "number", source, 1e-6)),
        max_seq_len=size("max_position_embeddings", 4096),
        attention="mla",
        kv_lora_rank=size("kv_lora_rank"),
        q_lora_rank=0 if q_lora is None else size("q_lora_rank"),
        qk_nope_dim=size("qk_nope_head_dim"),
        qk_rope_dim=size("qk_rope_head_dim"),
        v_head_dim=size("v_head_dim"),
        mla_rope_interleave=hf_field(hf, "rope_interleave", "bool", source, True),
        n_routed_experts=size("n_routed_experts"),
        n_shared_experts=size("n_shared_experts", 1),
        moe_top_k=size("num_experts_per_tok"),
        moe_d_ff=size("moe_intermediate_size"),
        moe_score="sigmoid",
        moe_n_groups=size("n_group", 1),
        moe_topk_groups=size("topk_group", 1),
        moe_norm_topk=hf_field(hf, "norm_topk_prob", "bool", source, True),
        moe_route_scale=float(hf_field(hf, "routed_scaling_factor", "number", source, 1.0)),
        moe_capacity_factor=None,
        moe_first_dense=first_dense,
        mtp_depth=mtp,
        mtp_layout="deepseek",
    )


def tensor_map(cfg: LMConfig) -> dict[str, HFTensor]:
    """Every state leaf of `Transformer(cfg)` -> its HF tensor (the inverse map writes the export)."""
    m = {"embed": HFTensor("model.embed_tokens.weight"), "final_norm/scale": HFTensor("model.norm.weight")}
    if not cfg.tie_embeddings:
        m["lm_head/kernel"] = HFTensor("lm_head.weight", transpose=True)
    k, n = cfg.moe_first_dense, cfg.n_layers
    # (our prefix, HF layer name, layer_offset, our leading axes for the layer, MoE?)
    blocks = ([("dense_blocks", "{i}", 0, ("layer",), False)] if k else []) + [("blocks", "{i}", k, ("layer",), True)]
    if cfg.mtp_depth:
        if cfg.mtp_layout != "deepseek":
            raise HFImportError(f"LMConfig.mtp_layout={cfg.mtp_layout!r}: deepseek_v3 MTP tensors need 'deepseek'")
        pre = f"model.layers.{n}."
        m |= {"mtp/norm_e/scale": HFTensor(pre + "enorm.weight"), "mtp/norm_h/scale": HFTensor(pre + "hnorm.weight"),
              "mtp/proj/kernel": HFTensor(pre + "eh_proj.weight", transpose=True),
              "mtp/out_norm/scale": HFTensor(pre + "shared_head.norm.weight")}
        blocks.append(("mtp/block", str(n), 0, (), True))
    for ours_pre, layer, offset, axes, moe in blocks:
        def add(ours: str, hf: str, transpose: bool = True, experts: bool = False, ours_pre=ours_pre, layer=layer,
                offset=offset, axes=axes):
            m[f"{ours_pre}/{ours}"] = HFTensor(f"model.layers.{layer}.{hf}", axes + (("expert",) if experts else ()),
                                               transpose, offset)

        add("input_norm/scale", "input_layernorm.weight", False)
        add("post_attn_norm/scale", "post_attention_layernorm.weight", False)
        if cfg.q_lora_rank:
            add("attn/q_a/kernel", "self_attn.q_a_proj.weight")
            add("attn/q_norm/scale", "self_attn.q_a_layernorm.weight", False)
            add("attn/q_b/kernel", "self_attn.q_b_proj.weight")
        else:
            add("attn/q_proj/kernel", "self_attn.q_proj.weight")
        add("attn/kv_a/kernel", "self_attn.kv_a_proj_with_mqa.weight")
        add("attn/kv_norm/scale", "self_attn.kv_a_layernorm.weight", False)
        add("attn/kv_b/kernel", "self_attn.kv_b_proj.weight")
        add("attn/o_proj/kernel", "self_attn.o_proj.weight")
        if not moe:
            for p in ("gate", "up", "down"):
                add(f"mlp/{p}/kernel", f"mlp.{p}_proj.weight")
            continue
        add("mlp/router", "mlp.gate.weight")
        add("mlp/bias", "mlp.gate.e_score_correction_bias", False)
        for p in ("gate", "up", "down"):
            add(f"mlp/w_{p}", f"mlp.experts.{{e}}.{p}_proj.weight", experts=True)
            if cfg.n_shared_experts:
                add(f"mlp/shared/{p}/kernel", f"mlp.shared_experts.{p}_proj.weight")
    return m


def hf_config_from_lm(cfg: LMConfig) -> dict:
    """LMConfig -> a deepseek_v3 config.json (``HFImportError`` naming the field it cannot express)."""
    rs = dict(cfg.rope_scaling or ())
    need = [(cfg.attention == "mla", "attention", "'mla'"), (cfg.is_moe, "n_routed_experts", "> 0"),
            (cfg.moe_score == "sigmoid", "moe_score", "'sigmoid'"), (not cfg.qkv_bias, "qkv_bias", "False"),
            (not cfg.fp8, "fp8", "False"),
            (cfg.mtp_depth == 0 or cfg.mtp_layout == "deepseek", "mtp_layout", "'deepseek' when mtp_depth > 0"),
            (cfg.n_shared_experts > 0, "n_shared_experts", "> 0"),
            (rs.get("rope_type", "yarn") == "yarn", "rope_scaling", "None or of rope_type 'yarn'")]
    for ok, field, want in need:
        if not ok:
            raise HFImportError(f"LMConfig.{field}={getattr(cfg, field)!r} cannot be expressed as model_type "
                                f"'deepseek_v3' (needs {want})")
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if rs:
        rope = {k: v for k, v in rs.items() if v is not None} | {"rope_theta": cfg.rope_theta}
    return dict(
        model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model, intermediate_size=cfg.d_ff, moe_intermediate_size=cfg.moe_d_ff,
        num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.n_heads,
        n_shared_experts=cfg.n_shared_experts, n_routed_experts=cfg.n_routed_experts,
        routed_scaling_factor=cfg.moe_route_scale, kv_lora_rank=cfg.kv_lora_rank, q_lora_rank=cfg.q_lora_rank or None,
        qk_rope_head_dim=cfg.qk_rope_dim, qk_nope_head_dim=cfg.qk_nope_dim, v_head_dim=cfg.v_head_dim,
        n_group=cfg.moe_n_groups, topk_group=cfg.moe_topk_groups, num_experts_per_tok=cfg.moe_top_k,
        first_k_dense_replace=cfg.moe_first_dense, norm_topk_prob=cfg.moe_norm_topk, hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len, initializer_range=cfg.init_std, rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings, rope_theta=cfg.rope_theta, rope_parameters=rope,
        rope_scaling=rope if rs else None, rope_interleave=cfg.mla_rope_interleave, attention_bias=False,
        attention_dropout=0.0, num_nextn_predict_layers=cfg.mtp_depth, use_cache=True,
    )


_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def ignored(name: str, cfg: LMConfig) -> bool:
    """Skipped checkpoint tensors: RoPE inv_freq, a tied model's lm_head, the MTP layers
    (``model.layers.{i}``, i >= num_hidden_layers) we do not import, and the MTP layer's copies of the
    embedding and head (``embed_tokens``, ``shared_head.head``)."""
    layer = _LAYER.match(name)
    i = -1 if layer is None else int(layer.group(1))
    copies = (".embed_tokens.weight", ".shared_head.head.weight")
    return (name.endswith(".rotary_emb.inv_freq") or (name == "lm_head.weight" and cfg.tie_embeddings)
            or i >= cfg.n_layers + cfg.mtp_depth or (i >= cfg.n_layers and name.endswith(copies)))


register_family("deepseek_v3", HFFamily(config_from_hf=config_from_hf, tensor_map=tensor_map,
                                        hf_config_from_lm=hf_config_from_lm, ignored=ignored))
