"""Datasets for GRPO on user data: local files -> rows -> fixed-width prompt ids, behind one interface
(``PromptSource``; the synthetic tasks on it are ``tasks.TaskDataset``, their rows ``tasks.task_rows``).

    rows = load_rows("train.jsonl")            # list[dict]; also .json, .parquet, a datasets save_to_disk dir
    ds = PromptDataset(rows, tokenizer, prompt_field="question", max_prompt_len=256,
                       fmt=PromptFormat("chat", system="..."), seed=0, required_fields=("answer",))
    ds.dropped, len(ds)                        # prompts longer than max_prompt_len (dropped, never cut), rows kept
    rows_b, ids, lens = ds.sample(step, n)     # list[dict] [n]; np.int32 [n, ds.prompt_len] right-padded; [n]
    texts = ds.prompt_strings(rows_b)          # rendered prompts (reward functions, logging)
    write_jsonl(rows, "demo.jsonl")            # rows as a JSONL file
    train, held = heldout_split(rows, n=None, seed=0)   # seeded random held-out rows (10%, at most 512)

Parquet and ``datasets`` directories need ``pip install jaxrl_reason[data]``.
"""

from jaxrl_reason.data.datasets import PromptDataset, PromptSource
from jaxrl_reason.data.loading import DataError, load_rows, require_fields, write_jsonl
from jaxrl_reason.data.prompts import PromptFormat, render_prompt
from jaxrl_reason.data.splits import heldout_split

__all__ = ["DataError", "load_rows", "require_fields", "write_jsonl", "PromptFormat", "render_prompt", "PromptDataset",
           "PromptSource", "heldout_split"]
