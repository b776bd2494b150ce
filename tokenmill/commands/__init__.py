"""What the `tokenmill` command serves beside the flow: inspecting and diffing datasets (verify), the terminal's
progress, a run's stored config for reruns (runs), certificates (certs) and the config reference."""
