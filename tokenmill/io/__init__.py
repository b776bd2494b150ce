"""Input and output: reading the corpus (readers, buffers), the build and published stores (storage), and the
OS-level reads and writes past the page cache (direct)."""
