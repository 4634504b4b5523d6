"""The `earl` command: `main` parses and dispatches; one module per verb group (`compress`, `answers`).

The top layer of the library: may import everything below it, never `api` (plugins add `earl serve`).
"""
