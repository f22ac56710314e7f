"""Strict configs: every float hyperparameter of every config dataclass is finite and in range,
checked by ``utils.validation.check_hyperparameters`` from each config's ``__post_init__``; the
CLI refuses a bad override before a run directory exists."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import subprocess
import sys

import pytest

import jaxrl_reason
from jaxrl_reason.cli import available_experiments, load_experiment
from jaxrl_reason.utils.validation import NONNEGATIVE, VALID, check_hyperparameters

NAN, INF = float("nan"), float("inf")
ROOT = pathlib.Path(__file__).resolve().parents[2]

#: Frozen dataclasses that are data or runtime objects, not configs (no ``check_hyperparameters``).
NOT_CONFIGS = {
    "jaxrl_reason.agents.hanabi.play.Agent",  # a policy function + its parameters
    "jaxrl_reason.agents.hanabi.records.Games",  # recorded games
    "jaxrl_reason.agents.spiral.rollout.LMGame",  # a game's env and text in an LM's ids, built by LMGame.make
    "jaxrl_reason.agents.spiral.agent.SpiralAgent",  # a rollout of the LM learner (its config: SpiralConfig)
    "jaxrl_reason.agents.memagent.trainer.MultiConvAgent",  # a rollout of the LM learner (MultiConvConfig)
    "jaxrl_reason.agents.joyagents.trainer.JoyAgent",  # a rollout of the LM learner (JoyConfig)
    "jaxrl_reason.agents.rally.llm_grpo.IntentAgent",  # a rollout of the LM learner (IntentGRPOConfig)
    "jaxrl_reason.rl.grpo.recipes.TaskStart",  # what a task experiment's run() opening returns (policy, held-out)
    "jaxrl_reason.envs.games.spec.GameSpec",  # a game's parts (env class, text, players, hooks), registered once
    "jaxrl_reason_experiment_device_check.Bench",  # a row of the device check: functions and budgets
    "jaxrl_reason.rl.onpolicy.Hooks",  # the on-policy trainer's functions (losses, critic input, partner)
    "jaxrl_reason.envs.games.text.Slot",  # a prompt template slot
    "jaxrl_reason.models.lm.hf_import.HFFamily",  # a checkpoint family's conversion functions
    "jaxrl_reason.models.lm.hf_import.HFTensor",  # where one parameter lives in a checkpoint
    "jaxrl_reason.search.procedure_cloning.ClonedTrace",  # generated text
    "jaxrl_reason.solvers.finance.LinearSystem",  # a generated matrix and right-hand side
    "jaxrl_reason.tasks.assistant.AssistantRequest",  # a generated problem
    "jaxrl_reason.tasks.base.Problem",
    "jaxrl_reason.tasks.longcontext.LongContextProblem",
    # reward functions: callables whose few arguments each validates itself
    "jaxrl_reason.rewards.builtin.ExactMatch", "jaxrl_reason.rewards.builtin.Inverted",
    "jaxrl_reason.rewards.builtin.MathVerify", "jaxrl_reason.rewards.builtin.Overlong",
    "jaxrl_reason.rewards.builtin.R1Format", "jaxrl_reason.rewards.builtin.TaskCorrect",
    "jaxrl_reason.rewards.builtin.WrongLabel", "jaxrl_reason.rewards.builtin.WithMalformedPenalty",
    "jaxrl_reason.utils.timing.Timings",  # measurements
    "jaxrl_reason.utils.validation.Range",  # the rule table's ranges themselves
    "jaxrl_reason.rewards.suite.RewardCall",  # a reward function and the keywords it declares
    "jaxrl_reason.rewards.suite.RewardScores",  # a batch's scores
    "jaxrl_reason.rl.grpo.recipes.Policy",  # a loaded model and tokenizer
    "jaxrl_reason.tasks.tool_calc.CalcEpisode", "jaxrl_reason.tasks.tool_calc.CalcProblem",  # generated episodes
}


# ------------------------------------------------------------------------------ the rule table
@dataclasses.dataclass(frozen=True)
class _Inner:  # no __post_init__ of its own: the outer config's check covers it
    clip_eps: float = 0.2


@dataclasses.dataclass(frozen=True)
class _Toy:
    lr: float = 1e-3
    learning_rate: float = 1e-3
    critic_lr: float = 1e-3
    clip_eps: float = 0.2
    max_grad_norm: float = 1.0
    ent_coef: float = 0.01
    kl_coef: float = 0.0
    gamma: float = 0.99
    gae_lambda: float = 0.95
    expert_prob: float = 0.5
    dropout: float = 0.1
    temperature: float = 1.0
    penalty: float = -1.0  # no rule: any finite number
    steps: int = 3  # ints are not checked
    weights: tuple[float, ...] = (1.0, 2.0)
    option: float | None = None
    aux_alpha: float = dataclasses.field(default=2.0, metadata={VALID: NONNEGATIVE})  # "*_alpha" would say [0, 1]
    inner: _Inner = _Inner()

    def __post_init__(self):
        check_hyperparameters(self)


@pytest.mark.parametrize("kw, msg", [
    (dict(lr=NAN), "_Toy.lr must be a finite number > 0, got nan"),
    (dict(lr=INF), "_Toy.lr must be a finite number > 0, got inf"),
    (dict(lr=0.0), "_Toy.lr must be a finite number > 0, got 0.0"),
    (dict(lr=0), "_Toy.lr must be a finite number > 0, got 0"),  # an int given to a float field
    (dict(learning_rate=-1e-3), "_Toy.learning_rate must be a finite number > 0"),
    (dict(critic_lr=-1.0), "_Toy.critic_lr must be a finite number > 0"),
    (dict(clip_eps=0.0), "_Toy.clip_eps must be a finite number > 0"),
    (dict(max_grad_norm=-1.0), "_Toy.max_grad_norm must be a number (inf allowed) > 0, got -1.0"),
    (dict(max_grad_norm=NAN), "_Toy.max_grad_norm"),
    (dict(ent_coef=NAN), "_Toy.ent_coef must be a finite number >= 0, got nan"),
    (dict(kl_coef=-0.1), "_Toy.kl_coef must be a finite number >= 0"),
    (dict(gamma=1.5), "_Toy.gamma must be a finite number in [0, 1], got 1.5"),
    (dict(gae_lambda=-0.1), "_Toy.gae_lambda must be a finite number in [0, 1]"),
    (dict(expert_prob=1.01), "_Toy.expert_prob must be a finite number in [0, 1]"),
    (dict(dropout=NAN), "_Toy.dropout"),
    (dict(temperature=-1.0), "_Toy.temperature must be a finite number >= 0"),
    (dict(penalty=-INF), "_Toy.penalty must be a finite number, got -inf"),
    (dict(weights=(1.0, NAN)), "_Toy.weights[1] must be a finite number >= 0, got nan"),
    (dict(option=NAN), "_Toy.option must be a finite number, got nan"),
    (dict(aux_alpha=-1.0), "_Toy.aux_alpha must be a finite number >= 0"),
    (dict(inner=_Inner(clip_eps=NAN)), "_Inner.clip_eps must be a finite number > 0, got nan"),  # nested
])
def test_rule_table_rejects(kw, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        _Toy(**kw)


def test_rule_table_accepts_valid_edges():
    _Toy(max_grad_norm=INF, ent_coef=0.0, gamma=1.0, gae_lambda=0.0, expert_prob=0.0, temperature=0.0,
         penalty=-5.0, steps=-1, weights=(0.0, 3.0), option=2.0, aux_alpha=5.0)


# ------------------------------------------------------------------------------ every config
def _modules():
    mods = [importlib.import_module(m.name) for m in pkgutil.walk_packages(jaxrl_reason.__path__, "jaxrl_reason.")
            if not m.name.startswith("jaxrl_reason.experiments")]  # the scripts: loaded below, as the CLI does
    experiments = {}
    for name, path in available_experiments().items():
        if re.search(r"^PRESETS\b", path.read_text(), re.M):  # scripts without presets are not experiments
            experiments[name] = load_experiment(name)
    return mods, experiments


MODULES, EXPERIMENTS = _modules()


def _dataclasses():
    out = {}
    for mod in [*MODULES, *EXPERIMENTS.values()]:
        for v in vars(mod).values():
            if (isinstance(v, type) and dataclasses.is_dataclass(v) and v.__module__ == mod.__name__
                    and not hasattr(v, "_flax_dataclass")):  # flax structs are pytrees (state), not configs
                out[f"{v.__module__}.{v.__qualname__}"] = v
    return out


ALL = _dataclasses()
CONFIGS = {k: v for k, v in ALL.items() if k not in NOT_CONFIGS}


def _calls_check(cls) -> bool:
    """``cls.__post_init__`` calls ``check_hyperparameters(self)``, itself or through ``super().__post_init__()``
    of a base config that does."""
    post = vars(cls).get("__post_init__")
    if post is None:
        return False
    source = inspect.getsource(post)
    if "check_hyperparameters(self)" in source:
        return True
    bases = [b for b in cls.__mro__[1:] if "__post_init__" in vars(b)]
    return "super().__post_init__()" in source and bool(bases) and _calls_check(bases[0])


def test_every_config_calls_the_shared_check():
    assert len(CONFIGS) >= 50 and not NOT_CONFIGS - set(ALL), sorted(NOT_CONFIGS - set(ALL))
    missing = sorted(k for k, cls in CONFIGS.items() if not _calls_check(cls))
    assert not missing, f"config dataclasses whose __post_init__ does not call check_hyperparameters: {missing}"


def _instances():
    """One valid instance per config class: the default, else one found in the presets."""
    found = {}

    def walk(x):
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            found.setdefault(type(x), x)
            for f in dataclasses.fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, tuple):
            for y in x:
                walk(y)

    for mod in EXPERIMENTS.values():
        for preset in mod.PRESETS.values():
            walk(preset)
    for cls in CONFIGS.values():
        try:
            found[cls] = cls()
        except TypeError:  # required fields: keep the preset's instance
            pass
    return found


INSTANCES = _instances()


def _float_fields():
    cases = []
    for key, cls in sorted(CONFIGS.items()):
        for f in dataclasses.fields(cls):
            if "float" in str(f.type):
                cases.append(pytest.param(cls, f.name, id=f"{cls.__name__}.{f.name}"))
    return cases


FLOAT_FIELDS = _float_fields()


def test_float_fields_are_found():
    assert len(FLOAT_FIELDS) >= 90  # 116 when written


@pytest.mark.parametrize("cls, name", FLOAT_FIELDS)
def test_nan_is_rejected(cls, name):
    base = INSTANCES.get(cls)
    assert base is not None, f"no default or preset instance of {cls.__qualname__}"
    value = getattr(base, name)
    bad = (NAN, *value[1:]) if isinstance(value, tuple) and value else NAN
    with pytest.raises(ValueError, match=rf"{cls.__name__}\.{name}\b.*nan"):
        dataclasses.replace(base, **{name: bad})


def test_every_preset_validates():
    assert len(EXPERIMENTS) >= 20
    for name, mod in EXPERIMENTS.items():
        assert mod.PRESETS, name
        for preset_name, preset in mod.PRESETS.items():
            check_hyperparameters(preset)
            dataclasses.replace(preset)  # runs every __post_init__ again


# ------------------------------------------------------------------------------ the CLI
@pytest.mark.slow
@pytest.mark.parametrize("override, msg", [
    (["--ppo.lr", "nan"], "PPOConfig.lr must be a finite number > 0, got nan"),
    (["--ppo.max-grad-norm", "-1"], "PPOConfig.max_grad_norm must be a number (inf allowed) > 0, got -1.0"),
])
def test_cli_refuses_before_creating_a_run(tmp_path, override, msg):
    root = tmp_path / "runs"
    env = {**os.environ, "COLUMNS": "300", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "ppo_catch.py"), *override, "--run-root", str(root)],
                          capture_output=True, text=True, env=env, timeout=300)
    out = " ".join(re.sub(r"[│╭╮╰╯─]", " ", proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, out
    assert msg in out, out
    assert not root.exists() or not any(root.iterdir())
