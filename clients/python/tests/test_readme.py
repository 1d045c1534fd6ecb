"""README.md against what it says: the examples it shows are exactly the files in examples/
(which the suites run as they are), the refused statuses it lists are the contract's; and its
install block, run as it is in a fresh folder beside a link to this clone (so
`./idempotency/...` is this tree), into a fresh virtual environment, from PyPI (pinned by
constraints.txt through PIP_CONSTRAINT); then nothing new in the source tree; then the first
app (examples/orders.py, copied as the README says) under uvicorn of that environment against
the real database: one order for the same request twice, the second a replay; the same key
with another body 422."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from conftest import free_port, request, with_database

PACKAGE = Path(__file__).resolve().parent.parent
ROOT = PACKAGE.parent.parent
README = (PACKAGE / "README.md").read_text()
EXAMPLES = PACKAGE / "examples"
# <!-- file: PATH --> then a fenced block: the file PATH (relative to the package), as it is
SHOWN_FILE = re.compile(r"<!-- file: (\S+) -->\n```\w*\n(.*?)```", re.S)


def block_after(marker: str, lang: str) -> str:
    m = re.search(re.escape(marker) + r"[^\n]*\n```" + lang + r"\n(.*?)```", README, re.S)
    assert m, f"README.md has no ```{lang} block after {marker!r}"
    return m.group(1)


def untracked(path: Path) -> set[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--ignored", "--untracked-files=all",
                          str(path)], capture_output=True, text=True, check=True).stdout
    return set(out.splitlines())


@pytest.fixture(scope="module")
def installed(tmp_path_factory, log_dir):
    if os.environ.get("IDEM_PY_SKIP_README") == "1":
        pytest.skip("IDEM_PY_SKIP_README=1: the README install check needs PyPI")
    home = tmp_path_factory.mktemp("readme")
    (home / "idempotency").symlink_to(ROOT)
    before = untracked(PACKAGE)
    env = {**os.environ, "PIP_CONSTRAINT": str(PACKAGE / "constraints.txt"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    log = log_dir / "readme-install.log"
    with open(log, "wb") as out:
        done = subprocess.run(["bash", "-e", "-c", block_after("<!-- install:", "sh")], cwd=home, env=env,
                              stdout=out, stderr=subprocess.STDOUT)
    assert done.returncode == 0, f"README's install block failed; see {log}"
    assert untracked(PACKAGE) == before, "installing wrote into the source tree"
    return home


def test_readme_shows_each_example_file_exactly():
    shown = {path: text for path, text in SHOWN_FILE.findall(README)}
    assert sorted(shown) == sorted(f"examples/{p.name}" for p in EXAMPLES.glob("*.py")), \
        "every file of examples/ is shown in README.md, under <!-- file: examples/NAME -->"
    for path, text in shown.items():
        assert text == (PACKAGE / path).read_text(), f"README.md's block differs from {path}"


def test_readme_lists_the_contracts_refused_statuses():
    contract = json.loads((ROOT / "contract" / "contract.json").read_text())
    m = re.search(r"contract/contract\.json's list, the same in\s+every package: ([\d, ]+):", README)
    assert m, "README.md no longer lists the refused statuses where it did"
    assert [int(s) for s in m.group(1).split(",")] == contract["refused_statuses"]["statuses"]


def test_readme_install_and_first_app(installed, db_url, log_dir):
    shutil.copy(EXAMPLES / "orders.py", installed / "orders.py")  # as the README says: a copy of the file
    url = fresh_database(db_url, "idem_readme")
    port = free_port()
    log = open(log_dir / f"readme-app-{port}.log", "ab")
    proc = subprocess.Popen([str(installed / "venv/bin/uvicorn"), "orders:app", "--port", str(port)], cwd=installed,
                            env={**os.environ, "DATABASE_URL": url}, stdout=log, stderr=log)
    check_orders_app(proc, log, port, url)


def fresh_database(db_url: str, name: str) -> str:
    """A new database NAME on the suite's server with the extension; its URL."""
    url = with_database(db_url, name)
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        c.execute(f"CREATE DATABASE {name}")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE EXTENSION idempotency")
    return url


def check_orders_app(proc: subprocess.Popen, log, port: int, url: str) -> None:
    """An example app serving POST /orders, once it answers: the same request twice gives 201,
    then the same body replayed, and one order row; the same key with another body 422; the app
    is stopped and its log closed."""
    try:
        deadline = time.monotonic() + 30
        headers = [("X-Api-Key", "acct_readme"), ("Idempotency-Key", f'"{uuid.uuid4()}"')]
        order = {"item": "book", "quantity": 1}
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, f"the example app did not start; see {log.name}"
            try:
                first = request(port, "POST", "/orders", order, headers)
                break
            except OSError:
                time.sleep(0.2)
        assert first.status == 201 and not first.replayed and first.json()["item"] == "book", first
        again = request(port, "POST", "/orders", order, headers)
        assert again.status == 201 and again.replayed and again.body == first.body, again
        other = request(port, "POST", "/orders", {"item": "pen", "quantity": 1}, headers)
        assert other.is_problem(422) and other.json()["type"].endswith(":idempotency-key-reused"), other
        with psycopg.connect(url) as c:
            assert c.execute("SELECT count(*) FROM orders").fetchone()[0] == 1
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()
