"""Plan models, DAG algorithms and the durable engine."""
