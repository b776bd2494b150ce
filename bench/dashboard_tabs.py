"""The Dask dashboard watched in a real browser across a run's end: does anything spill onto the run's terminal?

Each trial is a `tokenmill run` (examples/gpt2.yaml in 32 KB shards, a LocalCluster of 2 workers) watched as a
person watches it: once the run prints its dashboard's link, one tab opens the status page and stays open
across the run's end, a second opens the workers' page and is closed mid-run, and tabs keep being opened and
closed on the progress page until the run ends. A spill is a trial whose terminal (stdout and stderr) shows a
traceback or an error log line, or that exits non-zero. Prints one line a trial and the count of spills.

    .venv/bin/python bench/dashboard_tabs.py --trials 20

Needs Debian's chromium (`make chromium`) and Playwright (`pip install -e '.[test]'`).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright
from throughput import tokenmill_command  # beside this file

REPO = Path(__file__).resolve().parents[1]
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
LINK = re.compile(r"Dask dashboard: (http://\S+)")
SPILL = re.compile(r"Traceback|\| ERROR |ERROR - |CancelledError|AssertionError|tornado\.|bokeh\.|Failed sending")


def trial(browser, folder: Path) -> tuple[bool, str]:
    """One watched run; (spilled, what it printed)."""
    command = [*tokenmill_command(), "run", "examples/gpt2.yaml", "--set", f"output.path={folder}",
               "--set", "partition.shard_size=32KB", "--set", "dask.n_workers=2"]  # fmt: skip
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    link = threading.Event()

    def read() -> None:
        for line in run.stdout:
            lines.append(line)
            if LINK.search(line):
                link.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    context = browser.new_context()
    try:
        if link.wait(300):
            url = LINK.search("".join(lines))[1]
            held = context.new_page()  # open across the run's end
            held.goto(url, wait_until="commit")
            closed = context.new_page()  # closed mid-run
            closed.goto(url.replace("/status", "/workers"), wait_until="commit")
            closed.wait_for_timeout(1000)
            closed.close()
            while run.poll() is None:  # glances until the run ends
                glance = context.new_page()
                try:
                    glance.goto(url.replace("/status", "/individual-progress"), wait_until="commit")
                    glance.wait_for_timeout(700)
                except PlaywrightError:
                    pass  # the run ended and its dashboard with it
                finally:
                    glance.close()
        run.wait(600)
        held_for = 2.0  # the held tab sees the dashboard go away before it is closed
        time.sleep(held_for)
    finally:
        context.close()
        if run.poll() is None:
            run.kill()
        reader.join(30)
    printed = "".join(lines)
    return bool(SPILL.search(printed)) or run.returncode != 0, printed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    spills = 0
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as tmp:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        for n in range(args.trials):
            started = time.monotonic()
            spilled, printed = trial(browser, Path(tmp) / f"trial-{n}")
            spills += spilled
            print(f"trial {n + 1:2d}: {'SPILLED' if spilled else 'clean'} ({time.monotonic() - started:.0f} s)")
            if spilled:
                print("".join(line for line in printed.splitlines(keepends=True)[-60:]), file=sys.stderr)
        browser.close()
    print(f"{spills} spills in {args.trials} trials")
    sys.exit(1 if spills else 0)


if __name__ == "__main__":
    main()
