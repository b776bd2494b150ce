"""`python -m tokenmill`: the CLI."""

from tokenmill.cli import app

app(prog_name="tokenmill")
