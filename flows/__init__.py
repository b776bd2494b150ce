"""The Prefect flows that wire tokenmill's DAG (see DESIGN.md) and the runtime they need."""
