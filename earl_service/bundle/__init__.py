"""The bundle: one safetensors file that rebuilds every embedding, and what it costs in bytes.

Owns the file format (`format`, numpy and safetensors only), the pq codebooks (`codebooks`), decoding a file
into numpy values (`decode`), the torch-side `Bundle` that saves, loads and exports (`model_io`) and exact byte
sizes before training (`sizes`). May import `core`, `config`, `data` and `model`; `format`, `codebooks` and
`decode` stay torch-free because the device reader uses them.
"""
