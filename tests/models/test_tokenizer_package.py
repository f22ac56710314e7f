"""The tokenizer package's layout (issue #53): each module stays short (one job per module) and the old
import path ``jaxrl_reason.models.tokenizer`` (once one 657-line module) still exposes every public name it
did, as the same objects as the modules that define them now."""

import pathlib

import jaxrl_reason.models.tokenizer as package
from jaxrl_reason.models.tokenizer import base, char, chat, gguf, hf, spelled

MAX_LINES = 300
#: the public names of jaxrl_reason/models/tokenizer.py before it became a package
OLD_PUBLIC = ("ByteTokenizer", "CHARS", "CharTokenizer", "DEFAULT_SPECIAL", "HFTokenizer", "NAMED_TOKENS", "R1_SYSTEM",
              "R1_TAGS", "TagIds", "Tokenizer", "compile_chat_template", "read_json_object")
#: where each lives now (SPIRAL's byte tables and ASTRO's SpelledTokenizer / with_tokens moved in too)
HOMES = {base: ("DEFAULT_SPECIAL", "R1_TAGS", "TagIds", "Tokenizer"),
         chat: ("R1_SYSTEM", "ChatTemplates", "compile_chat_template"),
         char: ("CHARS", "ByteTokenizer", "CharTokenizer"),
         spelled: ("MAX_TOKEN_BYTES", "PRINTABLE", "UNKNOWN", "SpelledTokenizer", "byte_ids", "byte_offset",
                   "host_bytes", "token_bytes"),
         hf: ("NAMED_TOKENS", "HFTokenizer", "read_json_object", "with_tokens"),
         gguf: ("PRE_TOKENIZERS", "gguf_file_tokenizer")}


def test_every_module_of_the_package_is_short():
    modules = sorted(pathlib.Path(package.__file__).parent.glob("*.py"))
    assert len(modules) == 7, [m.name for m in modules]  # __init__ and the six of HOMES
    long = {m.name: n for m in modules if (n := len(m.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them by job): {long}"


def test_the_old_import_path_exposes_every_public_name():
    missing = [name for name in OLD_PUBLIC if not hasattr(package, name)]
    assert not missing, f"jaxrl_reason.models.tokenizer lost {missing}"
    assert set(OLD_PUBLIC) <= set(package.__all__)
    homes = {name: module for module, names in HOMES.items() for name in names}
    assert sorted(package.__all__) == sorted(homes), "__all__ and HOMES list different names"
    for name, module in homes.items():
        assert getattr(package, name) is getattr(module, name), name
        defined = getattr(module, name)
        if hasattr(defined, "__module__") and callable(defined):  # classes and functions: defined there
            assert defined.__module__ == module.__name__, (name, defined.__module__)
