"""The final answer of a completion, as graders read it, and what does not count as one.

    final_answer("<think>maybe 24</think> so the answer is 25.", prompt)      -> "25"
    final_answer("14 + 11 is a classic example of an expression", "What is 14 + 11?")  -> None
    final_answer(text, prompt, require="boxed")                              -> last \\boxed{} or None
    answers_match("25.0", "25")                                              -> True (normalised exact match)

Only the visible part of a completion is read: a thinking span (``<think>...</think>``, or everything
after a ``<think>`` the completion opens and never closes) is context, not an answer. ``require`` chooses where the answer may come from:

- ``"tag"``: the ``<answer>...</answer>`` span;
- ``"boxed"``: the balanced ``\\boxed{...}``;
- ``"any"`` (default): the tag span, else the last ``\\boxed{}``, else the last explicit ``answer is X`` /
  ``answer: X`` / ``= X`` (X a number, a fraction or ``$...$``, not the start of an expression), else the
  last number of the text when it is the text's only number of its own (two numbers not in the prompt:
  several candidates, no answer).

Two tag (or boxed) spans with different contents are two answers: the completion then has none (a
correct answer followed by a different final one, or a hedge, scores 0). A tag span is reduced to its own ``\\boxed{}`` or explicit answer when it holds one
(``<answer>The answer is 25</answer>`` -> ``25``). Then the candidate is refused (None) when it
merely restates the prompt: an arithmetic expression built only from the prompt's numbers
(``14 + 11``, ``11+14`` for "What is 14 + 11?"), and, for the last-number fallback only, a number that
occurs in the prompt, unless the completion is just that number (an explicit or tagged answer may
equal an operand). Candidates longer than ``MAX_ANSWER_CHARS`` are refused too (a bounded parse for
every completion).

Examples for the prompt "What is 14 + 11? Reply with just the number." (gold 25):

    "25"                                   -> "25"
    "14 + 11 = 25"                         -> "25"     (explicit "= X" at the end)
    "14 + 11 is a mathematical expression" -> None     (last number 11 is the prompt's)
    "The answer is 14 + 11."               -> None     (an expression of the prompt's numbers)
    "The answer is 24. No: the answer is 26" -> "26"   (the final one)
    "24. No wait, 26"                      -> None     (two candidates of its own)
    "<think>25</think>"                    -> None     (only inside the thinking span)
    "<answer>24 or 25</answer>"            -> "24 or 25" (several candidates: matches no single gold)
"""

from __future__ import annotations

import decimal
import re

REQUIRE = ("any", "tag", "boxed")
MAX_ANSWER_CHARS = 256

_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_BOXED = re.compile(r"\\boxed\s*\{")
_NUMBER = re.compile(r"\d+(?:,\d{3})+(?![\d,])(?:\.\d+)?|\d+(?:\.\d+)?")
# an explicit answer: "answer is X", "answer: X", "answer = X", or "= X"; X a (signed) number, fraction or $...$
_VALUE = r"(\$[^$]{1,%d}\$|[-+−]?\s?\d+(?:,\d{3})*(?:\.\d+)?(?:\s*/\s*\d+)?)(?!,?\d|\.\d|\s*[-+*/^×÷−]\s*[\d(])" % MAX_ANSWER_CHARS
_EXPLICIT = re.compile(r"(?:\banswer\b(?:\s+is|\s*[:=])|(?<![=<>!])=(?!=))\s*(?:\*\*)?\s*" + _VALUE, re.IGNORECASE)
_ARITHMETIC = re.compile(r"[\d.+\-*/^()×÷−]+")
_FRACTION = re.compile(r"[-+]?\d+/\d+")
_OPERATOR = re.compile(r"(?<=[\d)])[+\-*/^×÷−]")
_LATEX_OPS = (("\\times", "*"), ("\\cdot", "*"), ("\\div", "/"), ("\\left", ""), ("\\right", ""), ("{,}", ","))


def check_require(require: str) -> None:
    """ValueError unless ``require`` is one of ``REQUIRE``."""
    if require not in REQUIRE:
        raise ValueError(f"require must be one of {REQUIRE}, got {require!r}")


def visible_text(completion: str) -> str:
    """``completion`` without its thinking span: the text after the last ``</think>``, the text before a
    ``<think>`` the completion opened and never closed, else all of it (a prompt that opened ``<think>`` and a
    completion that never closes it: the completion is read whole, as R1-style prompts are trained)."""
    if "</think>" in completion:
        return completion.rsplit("</think>", 1)[1]
    if "<think>" in completion:
        return completion.split("<think>", 1)[0]
    return completion


def tag_spans(text: str) -> list[str]:
    """Contents of every ``<answer>...</answer>`` span, stripped, in order."""
    return [t.strip() for t in _TAG.findall(text)]


def boxed_spans(text: str) -> list[str]:
    """Contents of every ``\\boxed{...}`` whose braces balance, stripped, in order (an unbalanced one, e.g.
    truncated, is skipped)."""
    out = []
    for m in _BOXED.finditer(text):
        depth = 1
        for j in range(m.end(), len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                out.append(text[m.end():j].strip())
                break
    return out


def tag_span(text: str) -> str | None:
    """Content of the last ``<answer>...</answer>`` span, stripped; None if there is none."""
    spans = tag_spans(text)
    return spans[-1] if spans else None


def boxed_span(text: str) -> str | None:
    """Content of the last balanced ``\\boxed{...}``, stripped; None if there is none."""
    spans = boxed_spans(text)
    return spans[-1] if spans else None


def _committed(spans: list[str]) -> str | None:
    """The one answer of a completion's tag (or boxed) spans: None without spans, ``""`` marks two different
    ones (a completion that commits to two answers has none)."""
    if not spans:
        return None
    return spans[-1] if len({normalize_answer(t) for t in spans}) == 1 else ""


def numbers(text: str) -> list[str]:
    """The unsigned numbers of ``text`` in order, thousands separators removed (``"1,000"`` -> ``"1000"``)."""
    return [n.replace(",", "") for n in _NUMBER.findall(text)]


def _explicit(text: str) -> str | None:
    """The value of the last explicit answer of ``text`` ("answer is X", "answer: X", "= X"), or None."""
    last = None
    for last in _EXPLICIT.finditer(text):
        pass
    return None if last is None else last.group(1).strip()


def _signed_numbers(text: str) -> list[str]:
    """The numbers of ``text`` in order, with their minus sign when it is not a binary minus."""
    out = []
    for m in _NUMBER.finditer(text):
        before = text[: m.start()].rstrip()
        signed = m.start() > 0 and text[m.start() - 1] in "-−" and not re.search(r"[\d)\]]\s*[-−]$", before)
        out.append(("-" if signed else "") + m.group(0))
    return out


def _free_text(text: str, prompt: str) -> str | None:
    """The answer of untagged, unboxed text: its last explicit answer, else its last number, which does not
    count when the text holds other numbers of its own (several candidates) or when it is one of the
    prompt's numbers and the text is more than that number."""
    found = _explicit(text)
    if found is not None:
        return found
    found = _signed_numbers(text)
    if not found:
        return None
    prompt_numbers = set(numbers(prompt))
    own = {n for n in found if n.lstrip("-").replace(",", "") not in prompt_numbers}
    last = found[-1]
    if len(own) > 1 or (last not in own and _canonical(text) != _canonical(last)):
        return None
    return last


def _canonical(text: str) -> str:
    """Whitespace, ``$``, ``\\left``/``\\right`` removed, LaTeX products as ``*``, one trailing ``.`` dropped."""
    for a, b in _LATEX_OPS:
        text = text.replace(a, b)
    text = re.sub(r"\s+|\$", "", text).replace("−", "-")
    return text[:-1] if text.endswith(".") and not text.endswith("..") else text


def restates(candidate: str, prompt: str) -> bool:
    """``candidate`` is an arithmetic expression (operators between numbers, nothing else; not a bare fraction)
    whose numbers all occur in ``prompt``: the question restated, not answered."""
    c = _canonical(candidate)
    if not c or not _ARITHMETIC.fullmatch(c) or not _OPERATOR.search(c) or _FRACTION.fullmatch(c):
        return False  # not an expression (a number, or a fraction in lowest terms such as -7/2, is a value)
    prompt_numbers = set(numbers(prompt))
    return all(n in prompt_numbers for n in numbers(c))


def _reduce(span: str) -> str:
    """A tag span's own boxed or explicit answer when it holds one, else the span."""
    boxed = boxed_span(span)
    if boxed is not None:
        return boxed
    found = _explicit(span)
    return span if found is None else found


def final_answer(completion, prompt: str = "", require: str = "any") -> str | None:
    """The completion's final answer (see the module docstring), or None when it has none, only
    restates ``prompt``, or is longer than ``MAX_ANSWER_CHARS``."""
    check_require(require)
    if not isinstance(completion, str):
        return None
    prompt = prompt if isinstance(prompt, str) else ""
    text = visible_text(completion)
    candidate = _committed(tag_spans(text)) if require in ("any", "tag") else None
    if candidate is not None:
        candidate = _reduce(candidate) if candidate else None
    elif require in ("any", "boxed"):
        candidate = _committed(boxed_spans(text))
        if candidate == "":
            candidate = None
        elif candidate is None and require == "any":
            candidate = _free_text(text, prompt)
    if candidate is None or len(candidate) > MAX_ANSWER_CHARS or restates(candidate, prompt):
        return None
    return candidate


def normalize_answer(text) -> str:
    """For exact match: canonical text (``_canonical``), lower case, a number in its shortest decimal form
    (``"25.0"``, ``"+25"``, ``"1,000"`` -> ``"25"``, ``"25"``, ``"1000"``)."""
    t = _canonical(str(text)).lower()
    if re.fullmatch(r"[-+]?(\d+(,\d{3})*|\d*)(\.\d+)?", t) and any(ch.isdigit() for ch in t):
        d = decimal.Decimal(t.replace(",", ""))
        t = format(d.normalize(), "f")
        t = "0" if t in ("-0", "+0") else t.lstrip("+")
    return t


def answers_match(candidate: str | None, gold) -> bool:
    """Normalised exact match (``normalize_answer``) of an extracted answer against a gold label."""
    return candidate is not None and str(gold).strip() != "" and normalize_answer(candidate) == normalize_answer(gold)


__all__ = ["MAX_ANSWER_CHARS", "REQUIRE", "answers_match", "boxed_span", "check_require", "final_answer", "normalize_answer", "numbers",
           "restates", "tag_span", "tag_spans", "boxed_spans", "visible_text"]
