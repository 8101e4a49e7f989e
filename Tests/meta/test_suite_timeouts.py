"""The test configuration itself: one pytest.ini for every folder, and a folder's timeout (declared in its
conftest.py with pubsubtest.suite.suite_timeout) applies when pytest runs several folders in one call, as
scripts/test does, whichever folder comes first.

The run under test is a tiny tree built in a temporary folder from the repository's own pytest.ini, Tests/conftest.py
and Tests/pubsubtest: a fast folder first (default-like timeout, a test of 3 s), then a slow folder whose suite
timeout is 2 s and whose test sleeps 30 s. With one pytest.ini per folder, pytest read only the first folder's and
the slow test ran its full 30 s."""

import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "Tests")


def _suite(root, name, seconds, body):
    folder = os.path.join(root, "Tests", name)
    os.makedirs(folder)
    with open(os.path.join(folder, "conftest.py"), "w") as f:
        f.write("from pubsubtest.suite import suite_timeout\n\n"
                f"pytest_collection_modifyitems = suite_timeout(__file__, {seconds})\n")
    with open(os.path.join(folder, f"test_{name}.py"), "w") as f:
        f.write(f"import time\n\n\ndef test_{name}():\n    {body}\n")


def _tree(tmp_path):
    root = str(tmp_path)
    shutil.copy(os.path.join(REPO, "pytest.ini"), root)
    os.makedirs(os.path.join(root, "Tests"))
    shutil.copy(os.path.join(TESTS, "conftest.py"), os.path.join(root, "Tests"))
    os.symlink(os.path.join(TESTS, "pubsubtest"), os.path.join(root, "Tests", "pubsubtest"))
    _suite(root, "fast", 20, "time.sleep(3)")
    _suite(root, "slow", 2, "time.sleep(30)")
    return root


def _run(root, *folders):
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", *folders], cwd=root, capture_output=True,
                       text=True, timeout=90, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    return p, time.monotonic() - started


def test_a_suite_timeout_fails_the_run_when_its_folder_is_not_first(tmp_path):
    root = _tree(tmp_path)
    p, elapsed = _run(root, "Tests/fast", "Tests/slow")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "Timeout (>2.0s)" in out, out
    assert "1 failed, 1 passed" in out, out        # the slow folder's 2 s did not cut the fast folder's 3 s test
    assert elapsed < 25, (elapsed, out)             # the 30 s sleep was cut short


def test_a_suite_timeout_fails_the_run_when_its_folder_is_first(tmp_path):
    root = _tree(tmp_path)
    p, _ = _run(root, "Tests/slow", "Tests/fast")
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert "Timeout (>2.0s)" in out and "1 failed, 1 passed" in out, out


def test_one_pytest_configuration_and_no_import_path_edits():
    """No folder has its own pytest.ini (pytest would read one of them only), and no test or script edits
    sys.path: the shared support is imported as `pubsubtest`."""
    own_ini = [os.path.join(d, "pytest.ini") for d, _, files in os.walk(TESTS) if "pytest.ini" in files]
    assert own_ini == [], own_ini
    edits = []
    for top in (TESTS, os.path.join(REPO, "scripts")):
        for d, _, files in os.walk(top):
            for name in files:
                path = os.path.join(d, name)
                if path == os.path.abspath(__file__) or not (name.endswith(".py") or d.endswith("scripts")):
                    continue
                with open(path, errors="replace") as f:
                    if "sys.path.insert" in f.read():
                        edits.append(path)
    assert edits == [], edits
