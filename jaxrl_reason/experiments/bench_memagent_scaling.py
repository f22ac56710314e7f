"""MemAgent cost vs document length: seconds per document and XLA working memory at 1x..256x.

Uses the ``cpu`` preset's agent and model shapes with untrained weights: an untrained model never
stops a conversation early, so every memory update runs to its full length (the worst case), and
time per document should be exactly linear in the number of chunks. Time is the fastest of three
compiled calls; memory is XLA's compiled memory analysis (working buffers, excluding the input).

    python experiments/bench_memagent_scaling.py
"""

from __future__ import annotations

import pathlib
import sys

from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import memagent  # noqa: E402  (the experiment's presets)

from jaxrl_reason.agents.memagent.agent import MemAgent  # noqa: E402
from jaxrl_reason.agents.memagent.study import build_lm, length_batch  # noqa: E402
from jaxrl_reason.agents.memagent.trainer import agent_memory, evaluate_agent  # noqa: E402
from jaxrl_reason.models.tokenizer import CharTokenizer  # noqa: E402


def main(mults=(1, 4, 16, 64, 256), docs: int = 8) -> list[dict]:
    config = memagent.PRESETS["cpu"]
    tokenizer = CharTokenizer()
    agent = MemAgent(config.agent, tokenizer)
    graphdef, state = nnx.split(build_lm(config, tokenizer, config.lm.max_seq_len))
    rows = []
    for mult in mults:
        batch = length_batch(config, agent, mult, docs, stream=5)
        seconds = evaluate_agent(graphdef, state, batch, agent, timed=True)["seconds_per_doc"]
        memory = agent_memory(graphdef, state, batch, agent)
        rows.append({"x": mult, "sec_per_doc": seconds, "sec_per_doc_per_x": seconds / mult, **memory})
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r[k]:.6g}" if isinstance(r[k], float) else str(r[k]) for k in keys))
    return rows


if __name__ == "__main__":
    main()
