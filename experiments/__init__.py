"""Method experiments: one package per method, its scripts run from the repository root as modules (see README.md)."""
