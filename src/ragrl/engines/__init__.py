"""Generation engines: the `Engine` interface (engines/base.py), `HFEngine` (the module being trained,
KV kept across turns), `VLLMEngine` (a CUDA GPU), and `make_engine` by name (engines/registry.py)."""
