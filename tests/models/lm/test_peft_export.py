"""PEFT adapter export (`peft_export.save_peft_adapter`) against peft itself: tiny random transformers checkpoints
made here (fp32) get adapters with random non-zero A and B on every Linear kind we adapt (dense q/k/v/o,
gate/up/down, lm_head; DeepSeek-V3's MLA projections, dense and shared-expert MLPs); ``PeftModel.from_pretrained``
on the base and the exported adapter gives our adapted model's logits and the merged export's. The refusals are
tested by their messages."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from flax import nnx

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")

from jaxrl_reason.models.lm import LMConfig, Transformer, load_hf_model, save_hf_model  # noqa: E402
from jaxrl_reason.models.lm import peft_export  # noqa: E402
from jaxrl_reason.models.lm.hf_import import HFImportError, HFTensor  # noqa: E402
from jaxrl_reason.models.lm.lora import LoRAConfig, LoRAParam, adapted_linears, apply_lora  # noqa: E402
from jaxrl_reason.models.lm.peft_export import peft_adapter, save_peft_adapter  # noqa: E402
from testutil import hf_logits, model_logits, rel_error  # noqa: E402

V, T = 96, 10
TOKS = np.random.default_rng(0).integers(0, V, (2, T))
DENSE = dict(vocab_size=V, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CASES = {  # (HF config, LoRA targets, the target_modules of the adapter)
    "qwen2_all_and_lm_head": (
        lambda: transformers.Qwen2Config(**DENSE, tie_word_embeddings=False),
        ("all_linear", "lm_head"),
        {f"self_attn.{p}_proj" for p in "qkvo"} | {f"mlp.{p}_proj" for p in ("gate", "up", "down")}),
    "qwen3_q_v": (lambda: transformers.Qwen3Config(**DENSE, head_dim=8, tie_word_embeddings=True),
                  ("q_proj", "v_proj"), {"self_attn.q_proj", "self_attn.v_proj"}),
    "deepseek_mla": (  # MLA; layer 0 dense, layer 1 MoE with a shared expert (MLP adapters: refused, tested below)
        lambda: transformers.DeepseekV3Config(
            vocab_size=V, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
            topk_group=1, n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, max_position_embeddings=64,
            num_nextn_predict_layers=0, tie_word_embeddings=False),
        ("q_a", "q_b", "kv_a", "kv_b", "o_proj"),
        {f"self_attn.{p}" for p in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")}),
}


def _random_adapters(model, targets):
    """``model`` with rank-4 adapters (alpha 8: scaling 2) on ``targets``, A and B random (B non-zero)."""
    lm = apply_lora(model, LoRAConfig(rank=4, alpha=8.0, targets=targets))
    g, ad, rest = nnx.split(lm, LoRAParam, ...)
    ks = iter(jax.random.split(jax.random.key(3), len(jax.tree.leaves(ad))))
    ad = jax.tree.map(lambda x: 0.2 * jax.random.normal(next(ks), x.shape, x.dtype), ad)
    return nnx.merge(g, ad, rest)


@pytest.mark.parametrize("case", list(CASES))
def test_peft_loads_the_adapter_with_our_logits(case, tmp_path):
    make_config, targets, target_modules = CASES[case]
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(make_config()).float().eval().save_pretrained(tmp_path / "base")
    lm = _random_adapters(load_hf_model(tmp_path / "base"), targets)
    ours = np.asarray(model_logits(lm, TOKS))
    out = save_peft_adapter(lm, tmp_path / "adapter", base_model=tmp_path / "base")

    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == ("LORA", "CAUSAL_LM", 4, 8)
    assert config["base_model_name_or_path"] == str(tmp_path / "base")
    assert set(config["target_modules"]) == target_modules | ({"lm_head"} if "lm_head" in targets else set())
    from safetensors.numpy import load_file

    names = load_file(out / "adapter_model.safetensors")
    q = f"base_model.model.model.layers.1.{'self_attn.q_proj' if 'qwen' in case else 'self_attn.q_b_proj'}"
    assert names[f"{q}.lora_A.weight"].shape[0] == 4 and names[f"{q}.lora_B.weight"].shape[1] == 4  # [r, in], [out, r]

    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base").float().eval()
    base_rel = rel_error(hf_logits(base, TOKS), ours)  # before peft adapts ``base`` in place
    peft_model = peft.PeftModel.from_pretrained(base, out).eval()
    adapted = {n for n, m in peft_model.named_modules() if isinstance(m, peft.tuners.lora.LoraLayer)}
    assert adapted == {n.rsplit(".lora_", 1)[0] for n in names}  # peft adapted exactly the exported modules
    theirs = hf_logits(peft_model, TOKS)
    merged = hf_logits(transformers.AutoModelForCausalLM.from_pretrained(save_hf_model(lm, tmp_path / "merged")), TOKS)
    rel, rel_merged = rel_error(theirs, ours), rel_error(merged, theirs)
    print(f"{case}: peft vs ours {rel:.1e}, peft vs merged export {rel_merged:.1e} (base vs ours {base_rel:.1e})")
    assert base_rel > 1e-2  # the adapters matter
    assert rel < 1e-5 and rel_merged < 1e-5, (rel, rel_merged)


SMALL = LMConfig(vocab_size=64, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32)


def test_refusals_are_named(tmp_path, monkeypatch):
    base = Transformer(SMALL, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="no LoRA adapters"):
        save_peft_adapter(base, tmp_path / "a")
    lm = apply_lora(base, LoRAConfig(rank=2, targets=("q_proj", "v_proj")))
    adapted_linears(lm)[0][1].lora.scaling = 3.0
    with pytest.raises(ValueError, match=r"different \(rank, scaling, dropout\)"):
        save_peft_adapter(lm, tmp_path / "a")
    fp8 = apply_lora(base, LoRAConfig(rank=2))
    fp8.cfg = dataclasses.replace(SMALL, fp8=True, fp8_block=16)
    with pytest.raises(HFImportError, match="fp8=True"):
        save_peft_adapter(fp8, tmp_path / "a")

    lm = apply_lora(base, LoRAConfig(rank=2, targets=("q_proj",)))
    family = peft_export.get_family("llama")
    clash = {"blocks/mlp/up/kernel": HFTensor("model.layers.{i}.mlp.cross.self_attn.q_proj.weight", ("layer",), True)}
    monkeypatch.setattr(peft_export, "get_family", lambda _: dataclasses.replace(
        family, tensor_map=lambda cfg: family.tensor_map(cfg) | clash))
    with pytest.raises(HFImportError, match=r"target_modules \['self_attn.q_proj'\] would also adapt "
                                            r"\['model.layers.0.mlp.cross.self_attn.q_proj'"):
        save_peft_adapter(lm, tmp_path / "a")
    nowhere = {"blocks/attn/q_proj/kernel": HFTensor("model.layers.{i}.self_attn.q_proj.weight", ("layer",))}
    monkeypatch.setattr(peft_export, "get_family", lambda _: dataclasses.replace(
        family, tensor_map=lambda cfg: family.tensor_map(cfg) | nowhere))
    with pytest.raises(HFImportError, match="adapter on blocks/attn/q_proj: no Linear of a llama checkpoint"):
        save_peft_adapter(lm, tmp_path / "a")
    assert not (tmp_path / "a").exists()


MLA = LMConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, attention="mla", kv_lora_rank=16, qk_rope_dim=8,
               qk_nope_dim=8, v_head_dim=8, n_routed_experts=4, moe_top_k=2, moe_d_ff=16, moe_first_dense=1,
               n_shared_experts=1, d_ff=48, mtp_depth=1, mtp_layout="deepseek")


@pytest.fixture(scope="module")
def mla():
    return Transformer(MLA, rngs=nnx.Rngs(0))


def test_deepseek_mlp_adapters_are_refused(mla):
    """peft (with transformers >= 5) remaps a deepseek_v3 model's gate/up/down_proj targets onto its fused experts."""
    lm = apply_lora(mla, LoRAConfig(rank=2, targets=("o_proj", "up")))
    with pytest.raises(HFImportError, match=r"adapters on \['mlp.shared_experts.up_proj', 'mlp.up_proj'\] of a "
                                            "deepseek_v3 model have no peft name"):
        peft_adapter(lm)


def test_mtp_adapters_are_left_out_with_a_warning(mla):
    lm = apply_lora(mla, LoRAConfig(rank=2, targets=("o_proj",)))
    assert {p for p, _ in adapted_linears(lm)} == {"dense_blocks/attn/o_proj", "blocks/attn/o_proj",
                                                   "mtp/block/attn/o_proj"}
    with pytest.warns(UserWarning, match=r"MTP layer \(mtp/block/attn/o_proj\) are left out"):
        tensors, fields = peft_adapter(lm)
    assert fields["target_modules"] == ["self_attn.o_proj"]
    assert sorted(tensors) == [f"base_model.model.model.layers.{i}.self_attn.o_proj.lora_{x}.weight"
                               for i in range(2) for x in "AB"]  # layer 2 (the MTP layer) has none
