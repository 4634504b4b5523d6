"""The benchmarks' shared harness: what machine, commit and command ran (`machine`), the one results writer
(`results`: JSON + markdown (+ PNG) under bench/results/), where the datasets are (`datasets`), timing helpers
(`timing`) and the subprocesses a bench starts (`processes`: a training run, an API server)."""

from harness.datasets import add_datasets_argument, dataset_folder, default_datasets
from harness.machine import CPU_FEATURES, REPO, LoadWatch, describe_machine, environment
from harness.processes import api_server, free_port, run_settings, train_process
from harness.results import RESULTS, md_table, pyplot, save_png, widen_ylim, write_results
from harness.timing import cpu_seconds, median_seconds, percentiles, rss_mib

__all__ = ["CPU_FEATURES", "REPO", "RESULTS", "LoadWatch", "add_datasets_argument", "dataset_folder", "api_server", "cpu_seconds", "default_datasets",
           "describe_machine", "environment", "free_port", "md_table", "median_seconds", "percentiles", "pyplot", "rss_mib",
           "run_settings", "save_png", "train_process", "widen_ylim", "write_results"]
