"""The two jobs of `ragrl quickstart`: the main job (retriever_job.py: HARR's RL on the query encoder
over the full corpus, before/after on held-out questions) and the agent job (agent_job.py)."""
