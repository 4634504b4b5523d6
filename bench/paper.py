"""The paper's tables on a 2-core CPU, one subcommand per table, side by side with PyKEEN and the paper's figures.

    python bench/paper.py main [--quick]         # Tables 2/3: EARL, RotatE, PyKEEN RotatE, PyKEEN NodePiece+RotatE
    python bench/paper.py ablation [--quick]     # the five ablations + full EARL
    python bench/paper.py budget [--quick]       # Figure 4: MRR against #P, EARL vs RotatE (PNG)
    python bench/paper.py budget --calibrate 24  # this machine's step time for each finished point vs its record
    python bench/paper.py ksweep [--quick]       # Figure 5: k nearest reserved entities, k in {1, 5, 10, 30, 50} (PNG)
                                                 # full mode: 7,000 CoDEx-S steps per k, as the paper fixes steps
    python bench/paper.py convergence [--quick]  # valid MRR against wall-clock (PNG) + a search over training settings

Full mode uses the issue's budgets (2 h of wall-clock per run on FB15k-237 / WN18RR, CoDEx-S ablations to
convergence by early stopping, the k sweep a fixed step count per k) and takes hours to a day per table.
`--quick` trains on CoDEx-S for 1.5-4 minutes per run: it checks that every path works and gives a first look;
its numbers are not the paper's. Every run uses 2 torch threads and a wall-clock budget that includes periodic
validation; the best checkpoint by validation MRR is tested (filtered, realistic ranks). Results go to
bench/results/paper_<table>[_quick].{json,md,png}.

OMP_WAIT_POLICY defaults to PASSIVE here: on a shared 2-core machine, spinning OpenMP workers of a 2-thread run
lose most of their time to other processes (measured 3.0 -> 0.5 s per CoDEx-S RotatE step at load ~6).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # must precede the first torch import (libgomp reads it once)

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import add_datasets_argument
from paper_tables.ablation import cmd_ablation
from paper_tables.budget_curve import cmd_budget
from paper_tables.convergence import cmd_convergence
from paper_tables.ksweep import cmd_ksweep
from paper_tables.main_table import cmd_main
from paper_tables.settings import KSWEEP_STEPS, RECORDS, SETTINGS

from earl_service.train.loop import WARMUP_STEPS

TABLES = {"main": cmd_main, "ablation": cmd_ablation, "budget": cmd_budget, "ksweep": cmd_ksweep,
          "convergence": cmd_convergence}


def _table_options(parser: argparse.ArgumentParser) -> None:
    """What each table trains: datasets, budgets, and the per-table choices."""
    parser.add_argument("--quick", action="store_true", help="CoDEx-S, minutes per run")
    add_datasets_argument(parser)
    parser.add_argument("--data", nargs="+", choices=sorted(SETTINGS), help="which datasets (default per table)")
    parser.add_argument("--minutes", type=float, help="wall-clock budget per run (default per table and mode)")
    parser.add_argument("--converge-minutes", type=float, default=180.0,
                        help="cap for 'to convergence' runs in full mode (early stopping normally ends them)")
    parser.add_argument("--search-minutes", type=float, help="budget per settings-search run (convergence)")
    parser.add_argument("--no-search", action="store_true", help="convergence: skip the settings search")
    parser.add_argument("--no-rotate", action="store_true", help="convergence: EARL curves only")
    parser.add_argument("--tag", default="", help="suffix for the results files of a partial or custom run")
    parser.add_argument("--targets", type=float, nargs="+", help="budget: parameter targets in millions")
    parser.add_argument("--ks", type=int, nargs="+", help="ksweep: values of k")
    parser.add_argument("--steps", type=int,
                        help=f"ksweep: training steps per k, no early stopping (full mode default {KSWEEP_STEPS}; "
                             "quick mode: its minutes only)")
    parser.add_argument("--pykeen-negatives", type=int, default=64,
                        help="main: PyKEEN negatives per positive (0: the paper's 512, i.e. 256 per side)")
    parser.add_argument("--no-pykeen", action="store_true", help="main: skip the PyKEEN rows")
    parser.add_argument("--probe-steps", type=int, default=6,
                        help="main: steps timed at the paper's negatives for RotatE here and in PyKEEN (0: skip)")
    parser.add_argument("--calibrate", type=int, metavar="STEPS",
                        help="budget: train nothing for the table; time STEPS steps of each finished run's "
                             "configuration on this machine against its record (<table>_calibration.{json,md})")


def _cache_options(parser: argparse.ArgumentParser) -> None:
    """Where runs and records live, and which runs a sitting trains, reuses, retests or revalidates."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("runs/bench_paper"),
                        help="scratch: unfinished runs' checkpoints (WORK/runs/<dataset>-<key>/train), partial tables")
    parser.add_argument("--records", type=Path, default=RECORDS,
                        help="finished-run records (committed, so that tables accumulate across sittings)")
    parser.add_argument("--report", action="store_true",
                        help="train nothing: write the table from the runs finished so far")
    parser.add_argument("--fresh", action="store_true", help="train every run again, ignoring finished ones")
    parser.add_argument("--retest", nargs="+", metavar="TEXT",
                        help="test the finished runs of this repository's trainer whose label contains one of these "
                             "again with the current code, from their best checkpoint under --work (the record keeps "
                             "the earlier figures under 'retested')")
    parser.add_argument("--revalidate", nargs="+", metavar="TEXT",
                        help="finished runs of this repository's trainer whose label contains one of these and that "
                             "ended between two validations: validate their last step from the final checkpoint "
                             "under --work, keep it if best, test the best (old figures kept under 'revalidated')")
    parser.add_argument("--only", nargs="+", metavar="TEXT",
                        help="train only the runs whose label contains one of these (e.g. NodePiece); the others "
                             "are reported as finished earlier or not run yet, as with --report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=list(TABLES))
    _table_options(parser)
    _cache_options(parser)
    args = parser.parse_args()
    if args.calibrate is not None and args.calibrate <= WARMUP_STEPS:
        parser.error(f"--calibrate needs more than {WARMUP_STEPS} steps: the trainer's median step time skips the "
                     f"first {WARMUP_STEPS} (warm-up)")
    import torch

    torch.set_num_threads(2)
    TABLES[args.table](args)


if __name__ == "__main__":
    main()
