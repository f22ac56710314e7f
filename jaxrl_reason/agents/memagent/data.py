"""Host-side data for MemAgent: token batches of long-context problems and oracle SFT conversations.

    batch = doc_batch(problems, agent_cfg)               # DocBatch of right-padded token arrays
    convs = oracle_conversations(task, problems, cfg)    # [(prompt ids, response ids)], one per turn
    data = conversation_arrays(convs, seq_len)           # {"tokens" [N, T], "loss_mask" [N, T-1]}

The oracle conversations are what a tiny char-level LM trained from scratch needs before RL: every
memory update of the ideal overwrite rule (``task.oracle_update``) and the final answer, rendered
with exactly the agent's templates (``agent.render``), loss on the response (+ <eos>) only.
"""

from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from jaxrl_reason.agents.memagent.agent import DocBatch, MemAgentConfig, render
from jaxrl_reason.tasks.longcontext import LongContextProblem, LongContextTask, encode_plain
from jaxrl_reason.tasks.vocab import VOCAB


def doc_batch(problems: Sequence[LongContextProblem], config: MemAgentConfig, doc_width: int | None = None) -> DocBatch:
    """Problems -> DocBatch; raises if a question or an expected answer does not fit the agent's shapes."""
    if not problems:
        raise ValueError("doc_batch: no problems")
    doc, dlens = encode_plain([p.document for p in problems], doc_width)
    q, qlens = encode_plain([p.question for p in problems], config.question_tokens)
    a, alens = encode_plain([p.answer for p in problems], config.answer_tokens)
    return DocBatch(doc=jnp.asarray(doc), doc_lens=jnp.asarray(dlens), question=jnp.asarray(q),
                    question_lens=jnp.asarray(qlens), answer=jnp.asarray(a), answer_lens=jnp.asarray(alens))


def _ids(text: str) -> list[int]:
    return encode_plain([text])[0][0].tolist() if text else []


def oracle_conversations(task: LongContextTask, problems: Sequence[LongContextProblem],
                         config: MemAgentConfig) -> list[tuple[list[int], list[int]]]:
    """Every memory-update turn (chunk by chunk, oracle memory) and the final-answer turn of each problem."""
    if config.initial_memory != task.no_answer:
        raise ValueError(f"agent initial_memory {config.initial_memory!r} must equal the task's no_answer "
                         f"{task.no_answer!r} for the oracle memories to be consistent")
    c = config.chunk_tokens
    upd, fin = ("question", "chunk", "memory"), ("question", "memory")
    convs = []
    for p in problems:
        mem, q = config.initial_memory, _ids(p.question)
        for i in range(0, len(p.document), c):
            new = task.oracle_update(p.question, p.document[i:i + c], mem)
            prompt = render(config.update_template, upd, {"question": q, "chunk": _ids(p.document[i:i + c]),
                                                          "memory": _ids(mem)})
            convs.append((prompt, _ids(new) + [VOCAB.eos]))
            mem = new
        prompt = render(config.final_template, fin, {"question": q, "memory": _ids(mem)})
        convs.append((prompt, _ids(task.oracle_answer(p.question, mem)) + [VOCAB.eos]))
    return convs


def conversation_arrays(convs: Sequence[tuple[list[int], list[int]]], seq_len: int) -> dict[str, np.ndarray]:
    """-> {"tokens" [N, seq_len] int32, "loss_mask" [N, seq_len-1] float32 (1 on response targets)}."""
    tokens, lens = VOCAB.pad_batch([p + r for p, r in convs], seq_len)
    starts = np.asarray([len(p) for p, _ in convs])
    t = np.arange(seq_len - 1)[None]
    mask = (t + 1 >= starts[:, None]) & (t + 1 < lens[:, None])
    return {"tokens": tokens, "loss_mask": mask.astype(np.float32)}


__all__ = ["conversation_arrays", "doc_batch", "oracle_conversations"]
