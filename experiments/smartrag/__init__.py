"""SmartRAG: when to retrieve, at a retrieval cost. Scripts: python -m experiments.smartrag.<script>."""
