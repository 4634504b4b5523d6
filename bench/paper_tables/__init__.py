"""The paper's tables on a 2-core CPU (`bench/paper.py` is their command line): the fixed choices (`settings`), the
run cache shared by every table (`cache`), what each table prints beside its rows (`report`), and one module per
table: `main_table`, `ablation`, `budget_curve`, `ksweep`, `convergence`. The trainers are in `bench/trainers/`."""
