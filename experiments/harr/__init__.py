"""HARR: RL on the query encoder (retrieval only). Scripts: python -m experiments.harr.<script>."""
