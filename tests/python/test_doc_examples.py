"""The documentation's runnable examples, executed as written: every ```python block preceded by a
`<!-- ci-run -->` line in README.md and docs/PYTHON.md, each in a fresh interpreter from an empty
directory (what a reader who copies it gets). Needs the repository checkout next to tests/."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/PYTHON.md"]
BLOCK = re.compile(r"^<!-- ci-run -->\n```python\n(.*?)^```$", re.M | re.S)


def examples():
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        blocks = BLOCK.findall(text)
        # A marker that does not introduce a python block would silently drop its example.
        assert len(blocks) == text.count("<!-- ci-run -->"), f"{doc}: a ci-run marker without a block"
        for i, code in enumerate(blocks):
            yield pytest.param(code, id=f"{doc}#{i}")


EXAMPLES = list(examples())


def test_every_doc_has_an_example():
    docs = {p.id.split("#")[0] for p in EXAMPLES}
    assert docs == set(DOCS)


@pytest.mark.parametrize("code", EXAMPLES)
def test_example_runs(code, tmp_path):
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
