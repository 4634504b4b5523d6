"""The model in torch: the EARL encoder and the RotatE baseline (`modules`), the graph features they read
(`graph`) and the C++ CPU kernels with torch fallbacks (`kernels`). The numpy twins of its formulas live in
`earl_service.core`. May import `core`, `config`, `errors`, `atomic`; no I/O beyond the kernel build.
"""
