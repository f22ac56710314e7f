"""``jaxrl-reason run X --help`` of every experiment shows each config field's comment whole: tyro takes a field's help
from the comment on its line only, so a comment continued on the lines below it used to end mid-sentence
("... every run (default: 50)")."""

import ast
import dataclasses
import inspect
import io
import re
import sys
import textwrap
import tokenize

import pytest
import tyro

from jaxrl_reason import cli

#: the help as one string without layout: whitespace and rich's box characters removed (wrapping changes neither)
squash = lambda text: re.sub(r"[\s│╭╮╰╯─]+", "", text)


def field_comments(cls) -> list[tuple[str, str]]:
    """(the comment on its line, the whole comment) of each field of dataclass ``cls`` with a comment on its line; the
    whole comment goes on over the comment-only lines right below the field, unless tyro gives them to the next field
    (one without a comment of its own: they are the comment above it)."""
    source = textwrap.dedent(inspect.getsource(cls))
    comments = {tok.start[0]: (tok.string.lstrip("#:").strip(), not tok.line[:tok.start[1]].strip())
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    body = ast.parse(source).body[0].body
    starts = {node.lineno: node for node in body}
    out = []
    for field in (node for node in body if isinstance(node, ast.AnnAssign)):
        text, alone = comments.get(field.lineno, (None, True))
        if text is None or alone:
            continue
        more, line = [], field.end_lineno + 1
        while line in comments and comments[line][1]:
            more.append(comments[line][0])
            line += 1
        after = starts.get(line)
        if more and isinstance(after, ast.AnnAssign) and after.lineno not in comments:
            more = []  # tyro's comment above the next field
        out.append((text, " ".join([text, *more])))
    return out


def config_classes(presets) -> set[type]:
    """The config dataclasses of ``presets`` and of their nested dataclass values."""
    found, todo = set(), list(presets)
    while todo:
        value = todo.pop()
        if dataclasses.is_dataclass(value) and not isinstance(value, type) and type(value) not in found:
            found.add(type(value))
            todo += [getattr(value, f.name) for f in dataclasses.fields(value)]
    return found


def cut_comments(help_text: str, classes) -> tuple[list[str], int]:
    """(the field comments whose first line is in ``help_text`` but not all of them, how many comments were there)."""
    shown, cut, checked = squash(help_text), [], 0
    for cls in classes:
        for first, whole in field_comments(cls):
            if squash(first) in shown:
                checked += 1
                if squash(whole) not in shown:
                    cut.append(f"{cls.__module__}.{cls.__qualname__}: {whole}")
    return cut, checked


@dataclasses.dataclass(frozen=True)
class Cut:
    every: int = 50  # held-out evaluations every N steps (0: only before the first and
    # after the last step)
    keep: int = 3  # checkpoints kept
    # the comment above a field without one of its own (tyro shows it whole)
    seed: int = 0


def test_the_check_finds_a_comment_that_the_help_cuts(capsys):
    with pytest.raises(SystemExit):
        tyro.cli(Cut, args=["--help"])
    assert cut_comments(capsys.readouterr().out, [Cut]) == ([
        f"{__name__}.Cut: held-out evaluations every N steps (0: only before the first and after the last step)"], 2)


def test_every_experiments_help_shows_its_field_comments_whole(monkeypatch, capsys):
    """``--help`` of every experiment in jaxrl_reason/experiments (in-process; about 10 s in all)."""
    monkeypatch.setenv("COLUMNS", "80")  # one column of options (rich lays wider help out side by side)
    cut, checked = [], 0
    for name, path in cli.available_experiments().items():
        if not cli.describe(path)[1]:
            continue  # a script without PRESETS (bench_grpo_trl), not an experiment
        with pytest.raises(SystemExit):
            cli.run_experiment(name, ["--help"])
        module = sys.modules[f"jaxrl_reason_experiment_{name}"]
        found, n = cut_comments(capsys.readouterr().out, config_classes(module.PRESETS.values()))
        cut += [f"{name}: {c}" for c in found]
        checked += n
    assert not cut, "help that ends mid-sentence (make the comment one line, or put it above its field):\n" + "\n".join(
        cut)
    assert checked > 300  # the fields' comments were found in the help (400 in 27 experiments)
