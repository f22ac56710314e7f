"""Verifiable reasoning tasks: seeded generators with a difficulty knob, a prompt template and rewards
(token ids come from the tokenizer handed in; the presets use ``models.tokenizer.CharTokenizer``), and as prompt
data: ``TaskDataset`` (a ``data.PromptSource``), ``task_rows`` (rows for a dataset file)."""

from jaxrl_reason.tasks.base import Problem, ProblemBatch, make_batch, response_text, sft_batch
from jaxrl_reason.tasks.countdown import Countdown
from jaxrl_reason.tasks.dataset import TaskDataset, task_rows
from jaxrl_reason.tasks.logic import OrderingPuzzle
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.tasks.sorting import Parity, Sorting

TASKS = {"calc": RandomCalculation, "count": Countdown, "sort": Sorting, "parity": Parity, "order": OrderingPuzzle}

__all__ = ["Problem", "ProblemBatch", "make_batch", "response_text", "sft_batch", "Countdown", "OrderingPuzzle",
           "RandomCalculation", "Parity", "Sorting", "TASKS", "TaskDataset", "task_rows"]
