"""The Prefect flows that wire tokenmill's DAG (docs/architecture.md) and the runtime they need."""
