"""The search agents (Search-R1 and its kin): learning curves. Scripts: python -m experiments.search_agents.<script>."""
