"""The Python-source corpus: which files of the wheel are documents, and that train.py prepares it on first use."""
import zipfile

import pytest

from data.dataset import builtin, prepare_command
from data.sympy import prepare as sympy
from common import UserError


def wheel(tmp_path, files):
    path = tmp_path / "w.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, size in files.items():
            z.writestr(name, "x = 1\n" * (size // 6 + 1))
    return path


def test_a_document_is_a_source_file_of_the_package_long_enough_and_not_a_test(tmp_path, monkeypatch):
    path = wheel(tmp_path, {"sympy/core/basic.py": 4000, "sympy/core/tiny.py": 100, "sympy/core/tests/test_basic.py": 4000,
                            "sympy/test_x.py": 4000, "sympy/benchmarks/bench_a.py": 4000, "sympy/data.txt": 4000,
                            "sympy-1.13.3.dist-info/RECORD.py": 4000, "sympy/solvers/ode.py": 9000})
    monkeypatch.setattr(sympy, "N_FILES", 2)
    assert sorted(sympy.read_sources(path)) == ["sympy/core/basic.py", "sympy/solvers/ode.py"]
    monkeypatch.setattr(sympy, "N_FILES", 639)  # another wheel than the pinned one: refused, not used
    with pytest.raises(UserError, match="expected 639 source files"):
        sympy.read_sources(path)


def test_sympy_is_a_built_in_corpus():
    assert builtin("sympy") == "sympy" and prepare_command("data/sympy") == "python data/sympy/prepare.py"
    assert builtin("my_corpus") is None
