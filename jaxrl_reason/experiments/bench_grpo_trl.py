"""GRPO side by side with TRL: the same checkpoint, prompts, reward and configuration in TRL's ``GRPOTrainer``
(PyTorch) and ours (``rl.grpo.GRPOAgent`` on ``rl.lm.Learner``, JAX), each arm in its own subprocess, rounds interleaved.

    python experiments/bench_grpo_trl.py --model CKPT_DIR --data train.jsonl --prompt-field question \
        --answer-field answer --reward exact_match --prompts 8 --group 8 --max-new-tokens 16 --lr 2e-6
    python experiments/bench_grpo_trl.py --tiny        # smoke test: a tiny random Qwen3 + synthetic rows

Each round runs both arms (order alternating), each for ``--warmup`` + ``--steps`` steps; a step is one batch
of ``--prompts`` x ``--group`` completions: sampling, rewards, one policy update (one epoch, one minibatch;
``--beta`` the KL coefficient, 0 = no reference). The prompts are rendered with the checkpoint's chat template
in both arms (TRL gets conversational prompts); the reward functions are ours (``jaxrl_reason.rewards``), called
the same way in both. Matched settings: Adam (b2 0.999, TRL's), clip norm 1.0, constant learning rate,
temperature, token-mean loss (TRL's "dapo"), group-std advantages, eps 0.2. TRL's gradient checkpointing is its
default (on) unless ``--trl-no-gradient-checkpointing``; ours uses ``--remat`` (none / block / dots).
Reported: median steady step time (the steps after warmup, median over rounds of each round's median), each
round's own speed-up (the spread), peak resident memory (``ru_maxrss`` of the arm's process), the ratio ours / TRL,
and each arm's mean reward per step.
TRL and torch are benchmark dependencies only (``pip install trl``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="HF checkpoint directory (config.json, safetensors, tokenizer.json)")
    p.add_argument("--data", help="JSONL rows")
    p.add_argument("--prompt-field", default="question")
    p.add_argument("--answer-field", default="answer")
    p.add_argument("--reward", default="exact_match", help="a name of jaxrl_reason.rewards.REWARDS")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--max-prompt-len", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-6)
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0: no reference model)")
    p.add_argument("--remat", default="none", help="ours: none | block | dots")
    p.add_argument("--trl-no-gradient-checkpointing", action="store_true")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="smoke test: a tiny random checkpoint and synthetic data")
    p.add_argument("--record", metavar="PATH", help="write the speed-up and memory ratio as a record (utils.records)")
    p.add_argument("--arm", choices=("ours", "trl"), help=argparse.SUPPRESS)  # one arm, in a subprocess
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------- shared set-up
def _rows(args) -> list[dict]:
    from jaxrl_reason.data import load_rows

    return load_rows(args.data)


def _reward(args):
    from jaxrl_reason.rewards import make_reward

    if args.reward in ("exact_match", "math_verify"):
        return make_reward(args.reward, answer_field=args.answer_field)
    return make_reward(args.reward)


def _tiny(workdir: pathlib.Path) -> tuple[str, str]:
    """A byte-level BPE + random tiny Qwen3 checkpoint with a chat template, and 64 arithmetic rows."""
    import numpy as np
    import torch
    import transformers

    from jaxrl_reason.data import write_jsonl
    from jaxrl_reason.models.tokenizer import HFTokenizer

    rng = np.random.default_rng(0)
    rows = [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in rng.integers(0, 50, (64, 2))]
    data = write_jsonl(rows, workdir / "train.jsonl")
    special = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
    texts = [r["question"] for r in rows] + [f"<think>x</think><answer>{r['answer']}</answer>" for r in rows]
    tok = HFTokenizer.train_bpe(texts * 4, 400, special_tokens=special, eos="<|im_end|>", pad="<|endoftext|>",
                                bos="<|im_start|>")
    ckpt = workdir / "ckpt"
    tok.save(ckpt)
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    cfg_path = ckpt / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
    cfg.update(chat_template=template, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token="<|im_start|>")
    cfg_path.write_text(json.dumps(cfg))
    torch.manual_seed(0)
    mcfg = transformers.Qwen3Config(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                    max_position_embeddings=256, tie_word_embeddings=True,
                                    eos_token_id=tok.eos_id, pad_token_id=tok.pad_id, bos_token_id=tok.bos_id)
    transformers.Qwen3ForCausalLM(mcfg).float().eval().save_pretrained(ckpt)
    return str(ckpt), str(data)


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


# ---------------------------------------------------------------------------------------- the arms
def run_ours(args) -> dict:
    import jax
    import numpy as np

    from jaxrl_reason.data import PromptDataset, PromptFormat
    from jaxrl_reason.models.lm import load_model, load_tokenizer
    from jaxrl_reason.rl.lm.loss import LossConfig
    from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_learner

    tok = load_tokenizer(args.model)
    model = load_model(args.model)
    ds = PromptDataset(_rows(args), tok, args.prompt_field, args.max_prompt_len, PromptFormat("chat", "{prompt}", None),
                       args.seed, (args.answer_field,), args.data, fit=True)  # as TRL: no pad beyond the longest
    cfg = GRPOConfig(seed=args.seed, group_size=args.group, prompts_per_step=args.prompts, lr=args.lr,
                     max_grad_norm=1.0, adam_b2=0.999, temperature=args.temperature,
                     max_new_tokens=args.max_new_tokens, remat=args.remat,
                     loss=LossConfig(eps_low=0.2, eps_high=0.2, aggregation="token_mean", kl_coef=args.beta))
    learner, agent = grpo_learner(cfg, model, tok, ds, [_reward(args)], stop_strings=())
    state = learner.init(jax.random.key(args.seed), agent)
    step = learner.step_fn(agent)
    times, rewards = [], []
    for _ in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        state, m = step(state)
        times.append(time.perf_counter() - t0)
        rewards.append(float(np.asarray(m["reward"])))
    agent.close()
    return {"step_s": times, "reward": rewards, "peak_rss": _peak_rss()}


def run_trl(args) -> dict:
    import datasets
    import numpy as np
    import torch
    import transformers
    import trl

    reward = _reward(args)

    def reward_fn(prompts, completions, **fields):  # conversational: the texts are the messages' contents
        text = lambda x: x[-1]["content"] if isinstance(x, list) else x
        cols = {k: v for k, v in fields.items() if isinstance(v, list) and len(v) == len(completions)}
        return [float(r) for r in reward([text(p) for p in prompts], [text(c) for c in completions], **cols)]

    reward_fn.__name__ = args.reward
    rows = _rows(args)
    ds = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": r[args.prompt_field]}],
                                      args.answer_field: str(r[args.answer_field])} for r in rows])
    times, rewards, t0 = [], [], [0.0]

    class Timer(transformers.TrainerCallback):
        def on_step_begin(self, a, s, c, **kw):
            t0[0] = time.perf_counter()

        def on_step_end(self, a, s, c, **kw):
            times.append(time.perf_counter() - t0[0])

        def on_log(self, a, s, c, logs=None, **kw):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    cfg = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"), per_device_train_batch_size=args.prompts * args.group,
        num_generations=args.group, max_completion_length=args.max_new_tokens, temperature=args.temperature,
        learning_rate=args.lr, lr_scheduler_type="constant", adam_beta2=0.999, max_grad_norm=1.0, beta=args.beta,
        num_iterations=1, loss_type="dapo", scale_rewards="group", epsilon=0.2, max_steps=args.warmup + args.steps,
        logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=args.seed,
        gradient_checkpointing=not args.trl_no_gradient_checkpointing)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tok = transformers.AutoTokenizer.from_pretrained(args.model)
    trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward_fn], args=cfg, train_dataset=ds,
                              processing_class=tok, callbacks=[Timer()])
    trainer.train()
    return {"step_s": times, "reward": rewards[: len(times)] or [float("nan")] * len(times), "peak_rss": _peak_rss(),
            "torch_threads": torch.get_num_threads(), "mean_reward": float(np.mean(rewards)) if rewards else None}


# ---------------------------------------------------------------------------------------- the driver
def _child(args, arm: str, argv: list[str]) -> dict:
    """Run one arm in a subprocess with the options ``argv`` of the driver; its JSON result."""
    argv = [sys.executable, __file__, "--arm", arm] + [a for a in argv if a != "--tiny"]
    argv += ["--model", args.model, "--data", args.data]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"arm {arm} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _args(argv)
    if args.arm:
        print(json.dumps((run_ours if args.arm == "ours" else run_trl)(args)))
        return None
    if args.tiny:
        args.model, args.data = _tiny(pathlib.Path(tempfile.mkdtemp(prefix="bench_grpo_trl_")))
    if not (args.model and args.data):
        raise SystemExit("bench_grpo_trl: give --model and --data (or --tiny)")
    runs = {"ours": [], "trl": []}
    for r in range(args.rounds):
        for arm in (("ours", "trl") if r % 2 == 0 else ("trl", "ours")):
            res = _child(args, arm, argv)
            runs[arm].append(res)
            steady = res["step_s"][args.warmup:]
            print(f"round {r} {arm:>4}: steady step {statistics.median(steady):.3f} s, peak RSS "
                  f"{res['peak_rss'] / 2**30:.2f} GiB, reward per step {[round(x, 3) for x in res['reward']]}",
                  flush=True)
    summary = {}
    for arm, rs in runs.items():
        summary[arm] = {"step_s": statistics.median(statistics.median(x["step_s"][args.warmup:]) for x in rs),
                        "peak_rss_gib": max(x["peak_rss"] for x in rs) / 2**30}
    summary["ratio_step_ours_over_trl"] = summary["ours"]["step_s"] / summary["trl"]["step_s"]
    summary["ratio_rss_ours_over_trl"] = summary["ours"]["peak_rss_gib"] / summary["trl"]["peak_rss_gib"]
    # the spread: each round's speed-up (TRL's steady median / ours, the two arms of one round back to back)
    summary["speedup_per_round"] = [statistics.median(t["step_s"][args.warmup:]) /
                                    statistics.median(o["step_s"][args.warmup:]) for o, t in zip(runs["ours"], runs["trl"])]
    print(json.dumps(summary, indent=1))
    if args.record:
        from jaxrl_reason.utils.records import write_record

        steady = args.rounds * args.steps
        write_record(args.record, pathlib.Path(args.record).stem, [
            {"name": "speed-up (TRL step time / ours)", "value": 1 / summary["ratio_step_ours_over_trl"], "se": None,
             "n": steady, "unit": "x"},
            {"name": "speed-up, slowest round", "value": min(summary["speedup_per_round"]), "se": None, "n": 1,
             "unit": "x"},
            {"name": "speed-up, fastest round", "value": max(summary["speedup_per_round"]), "se": None, "n": 1,
             "unit": "x"},
            {"name": "peak RSS (ours / TRL)", "value": summary["ratio_rss_ours_over_trl"], "se": None, "n": args.rounds,
             "unit": "x"}], note=f"{args.rounds} interleaved round(s) of {args.steps} steady steps per arm; speed-up: "
            f"median over rounds of each arm's steady median (ours {summary['ours']['step_s']:.1f} s, TRL "
            f"{summary['trl']['step_s']:.1f} s a step), with the slowest and fastest round's own ratio; memory: "
            f"peak RSS {summary['ours']['peak_rss_gib']:.2f} / {summary['trl']['peak_rss_gib']:.2f} GiB")
    return summary


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
