"""The ``zfree`` command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _cmd_data_synth(a):
    from zfree.config import DataConfig
    from zfree.data.synth import write_benchmark

    cfg = DataConfig(vocab_size=a.vocab_size, n_min=a.n_min, n_max=a.n_max, strategies=tuple(a.strategies.split(",")),
                     prior=a.prior, n_train=a.n_train, n_val=a.n_val, n_test=a.n_test, seed=a.seed)
    out = write_benchmark(cfg, a.out)
    print(f"benchmark in {out}")


def _cmd_base_train(a):
    from zfree.base_training import train_base
    from zfree.config import BaseTrainConfig

    cfg = BaseTrainConfig(n_layer=a.n_layer, n_embd=a.n_embd, n_head=a.n_head, lr=a.lr, batch_size=a.batch_size,
                          max_steps=a.max_steps, max_minutes=a.max_minutes, target_ratio=a.target_ratio,
                          eval_every=a.eval_every, seed=a.seed)
    log = train_base(a.data, a.out, cfg, threads=a.threads)
    print(json.dumps({k: log[k] for k in ("steps", "wall_s", "c_base_analytic", "final_ratio")}, indent=2))


def _cmd_base_reference(a):
    from zfree.reference import build_reference

    ref = build_reference(a.base, a.data)
    print(json.dumps(ref.meta, indent=2))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="zfree", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    data = sub.add_parser("data", help="datasets").add_subparsers(dest="sub", required=True)
    s = data.add_parser("synth", help="generate the synthetic strategy benchmark")
    s.add_argument("--out", required=True)
    s.add_argument("--vocab-size", type=int, default=10)
    s.add_argument("--n-min", type=int, default=4)
    s.add_argument("--n-max", type=int, default=12)
    s.add_argument("--strategies", default="sort_asc,sort_desc,reverse,copy")
    s.add_argument("--prior", default="uniform", choices=["uniform", "x_dependent"])
    s.add_argument("--n-train", type=int, default=50_000)
    s.add_argument("--n-val", type=int, default=1_000)
    s.add_argument("--n-test", type=int, default=1_000)
    s.add_argument("--seed", type=int, default=0)
    s.set_defaults(func=_cmd_data_synth)

    base = sub.add_parser("base", help="the z-free base model").add_subparsers(dest="sub", required=True)
    b = base.add_parser("train", help="train the base GPT-2 and write its reference")
    b.add_argument("--data", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--n-layer", type=int, default=2)
    b.add_argument("--n-embd", type=int, default=128)
    b.add_argument("--n-head", type=int, default=4)
    b.add_argument("--lr", type=float, default=1e-3)
    b.add_argument("--batch-size", type=int, default=64)
    b.add_argument("--max-steps", type=int, default=60_000)
    b.add_argument("--max-minutes", type=float, default=45.0)
    b.add_argument("--target-ratio", type=float, default=1.05)
    b.add_argument("--eval-every", type=int, default=500)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=int, default=2)
    b.set_defaults(func=_cmd_base_train)
    r = base.add_parser("reference", help="(re)write a base run's z-free reference")
    r.add_argument("--base", required=True)
    r.add_argument("--data", required=True)
    r.set_defaults(func=_cmd_base_reference)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, FileNotFoundError, FileExistsError, KeyError) as e:
        print(f"zfree: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
