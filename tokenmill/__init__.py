"""tokenmill: a raw text corpus in, training-ready token data out.

This package is the pure library (no Prefect, no Dask): config, storage, readers, partition, tokenizer,
tokenize, packing, formats, validate, publish. `tasks/` and `flows/` orchestrate it; the `tokenmill` command is
`flows/cli.py`.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("tokenmill")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+source"
