"""The tests' forked `tokenmill` commands (`tests/prewarmed.py`) give what fresh ones give."""

from __future__ import annotations

import os
import stat

from .conftest import EXAMPLES, REPO, TOKENMILL
from .prewarmed import Forked, Interpreters, fresh


def test_a_forked_command_says_and_exits_as_a_fresh_one_in_its_own_folder(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLES / "demo.yaml").read_text().replace("seq_len: 1024", "seq_len: -5"))
    env = {**os.environ, "COLUMNS": "150"}
    commands = {  # the exit code a fresh process gives each, in its working directory
        ("check", "examples/gpt2.yaml", REPO): 0,  # found from the working directory
        ("check", str(bad), REPO): 2,  # refused, naming the key
        ("check", "examples/gpt2.yaml", tmp_path): 2,  # not there
        ("chek", REPO): 2,  # no such command: said on stderr
    }
    (tmp_path / "interpreters").mkdir()
    interpreters = Interpreters(tmp_path / "interpreters")
    seen = set()
    try:
        for (*args, cwd), code in commands.items():
            expected = fresh([*TOKENMILL, *args], env, cwd)
            said = expected.communicate(timeout=120)
            assert expected.returncode == code, said
            assert said[1 if args == ["chek"] else 0]  # said where the comparison below would see it missing
            for test in ("first", "second"):  # pytest's own variable differs from test to test
                started = interpreters.start([*TOKENMILL, *args], env | {"PYTEST_CURRENT_TEST": test}, cwd)
                assert isinstance(started, Forked) == (cwd in seen)  # forked once its environment is known
                seen.add(cwd)
                assert started.communicate(timeout=120) == said
                assert started.returncode == code
                assert started.pid not in {process.pid for process, _ in interpreters.running.values()}
        assert stat.S_IMODE((tmp_path / "interpreters").stat().st_mode) == 0o700
    finally:
        interpreters.close()
