"""Export a model's LoRA adapters as a PEFT adapter directory that ``peft.PeftModel.from_pretrained`` loads.

    save_hf_model(base, "out/base")                                  # or the checkpoint the base was loaded from
    save_peft_adapter(adapted, "out/adapter", base_model="out/base")
    # peft: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained("out/base"), "out/adapter")

Writes what peft's ``save_pretrained`` writes for a LoRA adapter, with neither peft nor torch imported:
adapter_config.json (peft_type LORA, task_type CAUSAL_LM, r, lora_alpha, lora_dropout, target_modules,
base_model_name_or_path) and adapter_model.safetensors (float32). Ours on a Linear with kernel [d_in, d_out]
is ``alpha/r * x @ a @ b`` with a [d_in, r], b [r, d_out]; peft's on the HF Linear (weight [d_out, d_in]) is
``lora_alpha/r * x @ lora_A.weight.T @ lora_B.weight.T`` with lora_A.weight [r, d_in], lora_B.weight
[d_out, r]. So, per layer, lora_A = a.T, lora_B = b.T, lora_alpha = alpha (the same scaling), named
``base_model.model.<HF module>.lora_A.weight`` (e.g. ``base_model.model.model.layers.0.self_attn.q_proj``).

The HF modules come from the export's tensor map (`HFFamily.tensor_map` of `hf_export.export_model_type`), so an
adapter on any Linear that `save_hf_model` writes maps: q/k/v/o, gate/up/down and lm_head of the dense families,
DeepSeek-V3's MLA projections (q_a/q_b/kv_a_proj_with_mqa/kv_b/o).
``target_modules`` lists each adapted module's name within its layer ("self_attn.q_proj",
"mlp.shared_experts.gate_proj", or "lm_head"), which peft matches as name suffixes. Adapters on the MTP layer
are left out with a warning (transformers does not build that layer: the adapter still gives the same logits).
Refused with one ``HFImportError``: adapters on a deepseek_v3 model's MLP Linears (dense or shared experts: peft
with transformers >= 5 reads every gate_proj / up_proj / down_proj target of that model type as its fused routed
experts), what `export_model_type` refuses (FP8), an adapter on a Linear no HF Linear holds, a target name that
would also adapt a module without an adapter; a ValueError: no adapters, or adapters of different rank / scaling
/ dropout (peft's config here holds one of each).
"""

from __future__ import annotations

import json
import pathlib
import re
import warnings

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from jaxrl_reason.models.lm.hf_export import export_model_type, write_directory
from jaxrl_reason.models.lm.hf_import import HFImportError, get_family, param_path
from jaxrl_reason.models.lm.lora import adapted_linears

ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."  # peft's PeftModelForCausalLM -> LoraModel -> the transformers model
#: model type -> target names that peft (with transformers >= 5) remaps onto the fused routed experts
PEFT_EXPERT_TARGETS = {"deepseek_v3": ("gate_proj", "up_proj", "down_proj")}


def _target(module: str) -> str:
    """peft's target name of a HF module: its name within its layer ("self_attn.q_proj"), else the module's."""
    return re.sub(r"^.*\.layers\.\d+\.", "", module)


def peft_adapter(model: nnx.Module) -> tuple[dict[str, np.ndarray], dict]:
    """(peft tensor name -> float32 array [r, d_in] / [d_out, r], the LoRA fields of adapter_config.json) of
    ``model``'s adapters (see the module docstring for the layout and what is refused)."""
    linears = adapted_linears(model)
    if not linears:
        raise ValueError("save_peft_adapter: the model has no LoRA adapters (apply_lora first)")
    settings = sorted({(m.lora.a.shape[-1], m.lora.scaling, m.lora.dropout) for _, m in linears})
    if len(settings) > 1:
        raise ValueError(f"save_peft_adapter: adapters of different (rank, scaling, dropout) {settings}; a peft "
                         "adapter written here holds one of each")
    (rank, scaling, dropout), = settings
    cfg = model.cfg
    model_type = export_model_type(cfg)
    tmap = get_family(model_type).tensor_map(cfg)
    tensors, adapted, mtp = {}, set(), []
    for path, m in linears:
        if path.startswith("mtp/"):
            mtp.append(path)
            continue
        t = tmap.get(f"{path}/kernel")
        if t is None or not t.transpose:
            raise HFImportError(f"LoRA adapter on {path}: no Linear of a {model_type} checkpoint holds its kernel")
        a, b = (np.asarray(jax.device_get(x[...]), np.float32) for x in (m.lora.a, m.lora.b))
        for ix, name in t.names(m.kernel.shape).items():
            module = name.removesuffix(".weight")
            adapted.add(module)
            tensors[f"{PREFIX}{module}.lora_A.weight"] = np.ascontiguousarray(np.swapaxes(a[ix], -1, -2))
            tensors[f"{PREFIX}{module}.lora_B.weight"] = np.ascontiguousarray(np.swapaxes(b[ix], -1, -2))
    if mtp:
        warnings.warn(f"LoRA adapters on the MTP layer ({', '.join(mtp)}) are left out of the peft adapter: "
                      "transformers does not build that layer", UserWarning, stacklevel=3)
    targets = sorted({_target(mod) for mod in adapted})
    remapped = [t for t in targets if t.rsplit(".", 1)[-1] in PEFT_EXPERT_TARGETS.get(model_type, ())]
    if remapped:
        raise HFImportError(f"LoRA adapters on {remapped} of a {model_type} model have no peft name: peft reads these "
                            "targets as the fused routed experts; leave the MLP Linears out of LoRAConfig.targets")
    shapes = {param_path(kp): leaf.shape for kp, leaf in jax.tree_util.tree_flatten_with_path(nnx.state(model))[0]}
    linear = {n.removesuffix(".weight") for p, t in tmap.items() if t.transpose and p in shapes and not
              p.startswith("mtp/") for n in t.names(shapes[p]).values()}
    extra = sorted(mod for mod in linear - adapted if any(mod == t or mod.endswith(f".{t}") for t in targets))
    if extra:
        raise HFImportError(f"target_modules {targets} would also adapt {extra[:3]} ({len(extra)} modules without "
                            "an adapter here) when peft loads the adapter")
    alpha = scaling * rank
    fields = {"r": rank, "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha, "lora_dropout": dropout,
              "target_modules": targets}
    return tensors, fields


def save_peft_adapter(model: nnx.Module, path, *, base_model: str | pathlib.Path | None = None,
                      overwrite: bool = False) -> pathlib.Path:
    """Write ``model``'s LoRA adapters (its ``cfg``: an LMConfig) as a PEFT adapter directory at ``path``; returns
    the path. base_model: the base checkpoint it applies to (a directory such as ``save_hf_model``'s export of the
    model without adapters, or a hub id), recorded as ``base_model_name_or_path``. Refuses an existing ``path``
    unless ``overwrite`` (replaced once the new one is complete; an interrupted export leaves nothing)."""
    tensors, fields = peft_adapter(model)
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path":
              None if base_model is None else str(base_model), "revision": None, **fields, "bias": "none",
              "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "modules_to_save": None,
              "layers_to_transform": None, "layers_pattern": None, "rank_pattern": {}, "alpha_pattern": {},
              "use_rslora": False, "use_dora": False}

    def write(tmp: pathlib.Path) -> None:
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})

    return write_directory(path, write, overwrite)


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "peft_adapter", "save_peft_adapter"]
