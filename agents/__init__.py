"""Tools, registries, the Agent base and the four role agents."""
