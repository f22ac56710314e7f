"""Issue 52's targets, read from the sources (``ast``, nothing imported): one LM learner in ``rl/lm``; no file
outside it builds an LM optimiser or calls the update builder; ``rl/lm`` imports no variant or agent package."""

import ast
import pathlib

from .test_import_graph import MODULES, imported

LM = "jaxrl_reason.rl.lm"
BUILDERS = ("lm_optimizer", "make_update")


def calls(path: pathlib.Path) -> set[str]:
    """Names of the functions ``path`` calls (plain names and attributes)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return out


def test_only_the_learner_builds_an_lm_optimiser_or_an_update():
    outside = {name: sorted(calls(path) & set(BUILDERS)) for name, path in MODULES.items()
               if not name.startswith(LM)}
    assert not {k: v for k, v in outside.items() if v}


def test_the_learner_imports_no_variant_or_agent():
    up = {name: sorted(t for t in imported(name, path) if t.startswith("jaxrl_reason.")
                       and not t.startswith((LM, "jaxrl_reason.models", "jaxrl_reason.parallel", "jaxrl_reason.utils",
                                             "jaxrl_reason.envs", "jaxrl_reason.rl.rae", "jaxrl_reason.rl.update")))
          for name, path in MODULES.items() if name.startswith(LM)}
    assert not {k: v for k, v in up.items() if v}


def test_one_lm_trainer_class():
    """No class named ...Trainer in the LM agents (the learner is the one; the on-policy MARL trainers are others)."""
    lm_parts = ("jaxrl_reason.agents.spiral", "jaxrl_reason.agents.memagent", "jaxrl_reason.agents.joyagents",
                "jaxrl_reason.agents.rally.llm_grpo", "jaxrl_reason.rl.grpo", "jaxrl_reason.experiments")
    found = [(name, node.name) for name, path in MODULES.items() if name.startswith(lm_parts)
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ClassDef)
             and node.name.endswith("Trainer")]
    assert not found
