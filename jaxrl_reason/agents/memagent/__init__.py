"""MemAgent (arXiv 2507.02259): a memory-overwrite agent that reads arbitrarily long documents chunk by
chunk with a bounded memory (``agent``), its oracle SFT data (``data``), Multi-Conv RL and evaluation
(``trainer``) and the full-context reader baseline (``reader``)."""
