"""The ``jaxrl-reason`` command: ``list``, ``run <experiment>``, ``bench <name>``.

Experiments are the scripts in the repository's ``experiments/`` folder (or the
folder named by ``$JAXRL_REASON_EXPERIMENTS``). Each defines ``PRESETS`` (name ->
frozen config dataclass) and ``run(config, run_dir) -> dict``. Any config field
can be overridden on the command line (tyro), e.g. ``--ppo.lr 1e-3``. Optional hooks:
``default_preset(overrides) -> name`` (the preset when ``--preset`` is not given; else ``cpu``) and
``check_flags(config, fields)`` (refuse, with a ValueError, an option given that the run would not use; a config it
returns is the one run: defaults settled by what was given).
Another, ``record(summary) -> [figure dicts]``, gives the figures ``--record PATH`` writes (``utils.records``).

A run that fails before its first step leaves no run directory; ``--resume`` continues the latest run of the same
experiment and config (``utils.experiment.pick_resume``). Ctrl-C stops a run at the next step boundary with a
checkpoint (``utils.loop.run_chunks``) and prints the command that resumes it (exit code 130); a second Ctrl-C
aborts at once.

Multi-process runs: start the same command once per process with ``--coordinator HOST:PORT
--num-processes N --process-id I`` (or the JAXRL_* variables, or inside ``srun``; see
``parallel.distributed``). The processes join before any device is used, check that they all run
the same experiment, preset, options and config, and share one run directory written by process 0.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import pathlib
import shlex
import sys
import types

import tyro

from jaxrl_reason.data.loading import DataError
from jaxrl_reason.models.lm.hf_import import HFImportError
from jaxrl_reason.parallel import distributed
from jaxrl_reason.rewards.suite import RewardError
from jaxrl_reason.utils import guard, records
from jaxrl_reason.utils.checkpoint import CheckpointError
from jaxrl_reason.utils.experiment import RunDir, RunDirError, config_to_dict
from jaxrl_reason.utils.loggers import LOGGERS, LoggerError
from jaxrl_reason.utils.loop import Interrupted

#: Failures a run reports as one clear line (exit code 1) instead of a traceback: the run dir, a checkpoint,
#: a NaN/inf, the user's dataset, reward function or HF checkpoint directory, processes that cannot meet or agree.
#: Bad input met while running (a batch that does not divide the devices, a missing file, ...): one line too;
#: JAXRL_REASON_TRACEBACK=1 shows the traceback (e.g. to report a bug).
INPUT_ERRORS = (ValueError, FileNotFoundError)
RUN_ERRORS = (RunDirError, CheckpointError, guard.NonFiniteError, DataError, RewardError, HFImportError,
              distributed.DistributedError, LoggerError)


def experiments_dir() -> pathlib.Path:
    """The experiment scripts: ``jaxrl_reason/experiments/`` (installed with the package), or
    ``$JAXRL_REASON_EXPERIMENTS``."""
    env = os.environ.get("JAXRL_REASON_EXPERIMENTS")
    path = pathlib.Path(env) if env else pathlib.Path(__file__).resolve().parent / "experiments"
    if not path.is_dir():
        raise SystemExit(f"experiments folder not found at {path}; unset JAXRL_REASON_EXPERIMENTS or point it at a "
                         "folder of experiment scripts")
    return path


def available_experiments() -> dict[str, pathlib.Path]:
    return {p.stem: p for p in sorted(experiments_dir().glob("*.py")) if not p.stem.startswith("_")}


def load_experiment(name_or_path: str) -> types.ModuleType:
    path = pathlib.Path(name_or_path)
    if path.suffix != ".py":
        found = available_experiments()
        if name_or_path not in found:
            raise SystemExit(
                f"unknown experiment {name_or_path!r}; available: {', '.join(found) or '(none)'}"
            )
        path = found[name_or_path]
    spec = importlib.util.spec_from_file_location(f"jaxrl_reason_experiment_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclass/tyro type resolution looks the module up
    spec.loader.exec_module(module)
    for attr in ("PRESETS", "run"):
        if not hasattr(module, attr):
            raise SystemExit(f"{path} is not an experiment: it defines no {attr}")
    return module


def run_experiment(name_or_path: str, argv: list[str]) -> dict:
    module = load_experiment(name_or_path)
    name = pathlib.Path(name_or_path).stem
    parser = argparse.ArgumentParser(prog=f"jaxrl-reason run {name}", add_help=False)
    parser.add_argument("--preset", choices=sorted(module.PRESETS),
                        help=f"default: {getattr(module, 'DEFAULT_PRESET_HELP', 'cpu')}")
    parser.add_argument("--resume", nargs="?", const=True, default=False,
                        help="continue the latest run of this experiment with this config that did a step (or "
                        "the run dir given)")
    parser.add_argument("--run-root", default="runs", help="where run directories go")
    parser.add_argument("--on-nonfinite", default="raise", choices=guard.POLICIES,
                        help="a NaN/inf loss, gradient or parameter: stop the run (raise) or skip the update")
    parser.add_argument("--logger", nargs="+", default=["tensorboard"], choices=(*LOGGERS, "none"),
                        help="where metrics go besides metrics.jsonl: tensorboard (default), wandb (WANDB_MODE, "
                        "WANDB_PROJECT, WANDB_ENTITY apply), both, or none")
    parser.add_argument("--record", metavar="PATH", help="write the run's figures as a record (docs/records/CLAIM.json"
                        ": the experiment's record(summary) hook, else every scalar of the summary; utils.records)")
    multi = parser.add_argument_group("multi-process runs (see jaxrl_reason.parallel.distributed)")
    multi.add_argument("--coordinator", help="HOST:PORT of process 0, the same for every process; 'auto': JAX "
                       "detects the cluster (TPU pod, SLURM, MPI). Default: $JAXRL_COORDINATOR")
    multi.add_argument("--num-processes", type=int, help="processes in the run (default: $JAXRL_NUM_PROCESSES)")
    multi.add_argument("--process-id", type=int, help="this process, 0..N-1 (default: $JAXRL_PROCESS_ID)")
    multi.add_argument("--coordinator-timeout", type=float, default=120.0,
                       help="seconds to wait for the coordinator and the other processes (default 120)")
    args, rest = parser.parse_known_args(argv)
    if args.preset is None:  # the experiment may choose by the options given (grpo: checkpoint with --model)
        args.preset = module.default_preset(rest) if hasattr(module, "default_preset") else "cpu"
    if "-h" in rest or "--help" in rest:
        parser.print_help()
        print("\npresets (their values that differ from the config defaults shown below):")
        for preset, diff in preset_differences(module.PRESETS).items():
            shown = ", ".join(f"{k}={v}" for k, v in diff.items()) or "the defaults"
            print(f"  {preset}: {shown}")
        print("\nconfig overrides (on top of the preset; defaults are the chosen preset's values):")
    preset = module.PRESETS[args.preset]
    try:
        config = tyro.cli(type(preset), default=preset, args=rest, prog=f"jaxrl-reason run {name}")
        if hasattr(module, "check_flags"):  # options given that this run would not use
            config = module.check_flags(config, given_flags(rest)) or config
    except ValueError as err:  # raised by the config's own validation
        raise SystemExit(f"invalid config for {name}: {' '.join(str(err).split())}") from None
    run_dir, kept = None, False
    try:
        join_run(args, name, config)
        run_dir = RunDir.create(name, config, root=args.run_root, resume=args.resume,
                                on_nonfinite=args.on_nonfinite,
                                loggers=[n for n in args.logger if n != "none"])
        where = f" process {distributed.process_index()}/{distributed.process_count()}" * (
            distributed.process_count() > 1)
        picked = " (--resume: the latest run of this configuration)" if args.resume is True else ""
        print(f"[{name}] preset={args.preset}{where} run dir: {run_dir.path}{picked}", flush=True)
        if run_dir.is_writer:
            print(f"[{name}] setting up: loading the model and data, building the trainer", flush=True)
        try:
            summary = module.run(config, run_dir)
            run_dir.save_json("summary", summary or {})
        except BaseException:
            kept = not run_dir.discard_if_unstarted()  # a run that did no step leaves nothing to --resume
            raise
        finally:
            run_dir.close()
    except Interrupted as stop:  # Ctrl-C, stopped at a step boundary with a checkpoint (utils.loop)
        sub = pathlib.Path(stop.path)  # a sub-run's (``RunDir.child``) is named after the step
        sub = sub.relative_to(run_dir.path) if sub.is_relative_to(run_dir.path) else sub
        print(f"[{name}] interrupted after step {stop.step}{f' of {sub}' if str(sub) != '.' else ''}; resume with: "
              f"{resume_command(name_or_path, argv, run_dir.path)}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside a training loop
        said = (f"aborted; resume from its last checkpoint with: {resume_command(name_or_path, argv, run_dir.path)}"
                if kept else "interrupted before the first step; nothing kept")
        print(f"[{name}] {said}", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except (*RUN_ERRORS, *INPUT_ERRORS) as err:  # clear message, exit code 1, no traceback
        if isinstance(err, INPUT_ERRORS) and os.environ.get("JAXRL_REASON_TRACEBACK") == "1":
            raise
        raise SystemExit(f"{name}: {type(err).__name__}: {' '.join(str(err).split())}") from None
    print(json.dumps(summary, indent=2, default=str))
    if args.record and distributed.process_index() == 0:
        figures = module.record(summary) if hasattr(module, "record") else records.summary_figures(summary or {})
        records.write_record(args.record, pathlib.Path(args.record).stem, figures,
                             command=" ".join(["jaxrl-reason", "run", name, *argv]))
    return summary


def resume_command(name_or_path: str, argv: list[str], path) -> str:
    """The command that resumes the run in ``path``: ``jaxrl-reason run NAME ARGV --resume PATH`` (any ``--resume``
    in ``argv`` replaced; NAME as given, or the experiment's name for a script of the experiments folder)."""
    script = pathlib.Path(name_or_path)
    ours = script.suffix != ".py" or available_experiments().get(script.stem) == script.resolve()
    shown = script.stem if ours else name_or_path
    kept, skip = [], False
    for i, arg in enumerate(argv):
        if skip or arg.startswith("--resume="):
            skip = False
            continue
        if arg == "--resume":  # and its optional path (argparse's nargs="?")
            skip = i + 1 < len(argv) and not argv[i + 1].startswith("-")
            continue
        kept.append(arg)
    return shlex.join(["jaxrl-reason", "run", shown, *kept, "--resume", str(path)])


def given_flags(argv: list[str]) -> set[str]:
    """The config fields an override list names, dotted with underscores: ``--grpo.max-new-tokens 8`` ->
    ``grpo.max_new_tokens``."""
    return {arg[2:].split("=", 1)[0].replace("-", "_") for arg in argv if arg.startswith("--")}


def join_run(args: argparse.Namespace, name: str, config) -> None:
    """Join the multi-process run the flags / environment describe (nothing for one process), then
    check on every process that all of them run the same experiment, preset, options and config."""
    try:
        distributed.initialize(args.coordinator, args.num_processes, args.process_id,
                               timeout=args.coordinator_timeout)
    except ValueError as err:
        raise SystemExit(f"{name}: {err}") from None
    launch = {"experiment": name, "preset": args.preset, "resume": args.resume, "run_root": args.run_root,
              "on_nonfinite": args.on_nonfinite, "config": config_to_dict(config)}
    distributed.check_same("the experiment, preset, options or config",
                           json.dumps(launch, sort_keys=True, default=str))


def describe(path: pathlib.Path) -> tuple[str, list[str]]:
    """(the first paragraph of an experiment's docstring as one line, its preset names), read without importing it."""
    tree = ast.parse(path.read_text())
    summary = " ".join((ast.get_docstring(tree) or "").strip().split("\n\n")[0].split())
    presets = [k.value for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
               and any(isinstance(t, ast.Name) and t.id == "PRESETS" for t in node.targets)
               for k in node.value.keys if isinstance(k, ast.Constant)]
    return summary, presets


def preset_differences(presets: dict) -> dict[str, dict]:
    """Each preset's values that differ from its config class's defaults, as dotted names."""
    from jaxrl_reason.utils.experiment import _flat

    out = {}
    for name, preset in presets.items():
        try:
            base = _flat(config_to_dict(type(preset)()))
        except TypeError:  # a config class without defaults for every field: show all values
            base = {}
        values = _flat(config_to_dict(preset))
        out[name] = {k: v for k, v in values.items() if base.get(k, object()) != v}
    return out


def script_main(script_file: str) -> None:
    """``python experiments/x.py [--preset cpu] [overrides]``."""
    run_experiment(script_file, sys.argv[1:])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        print("usage: jaxrl-reason list | run <experiment> [--preset cpu|gpu] [--resume] [overrides]"
              " | bench <name> [...]")
        return
    command, rest = argv[0], argv[1:]
    if command == "list":
        for name, path in available_experiments().items():
            summary, presets = describe(path)
            print(f"{name:24s} [{', '.join(presets)}] {summary}")
    elif command in ("run", "bench"):
        if not rest:
            raise SystemExit(f"usage: jaxrl-reason {command} <name> [options]")
        name = rest[0] if command == "run" or rest[0].startswith("bench_") else f"bench_{rest[0]}"
        run_experiment(name, rest[1:])
    else:
        raise SystemExit(f"unknown command {command!r}; use list, run or bench")


if __name__ == "__main__":
    main()
