"""MMOA-RAG: multi-agent MAPPO (rewriter, selector, generator). Scripts: python -m experiments.mmoa.<script>."""
