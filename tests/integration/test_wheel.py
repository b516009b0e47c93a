"""The wheel, installed into a clean venv outside the checkout: `dpstream.*` only, data files shipped, tools left out.

One module fixture builds the wheel from a copy of the sources (pip, like a user's `pip wheel`; the
copy keeps the checkout's dpstream.egg-info, whose SOURCES.txt setuptools reads, and leaves out a
stale `build/`, whose old files setuptools would ship) and installs it, without dependencies, into a
venv made without pip's site packages. The dependencies come from this interpreter's site-packages
through a plain path entry in a .pth file added after the install: such an entry puts the directory
on sys.path but runs none of its .pth files, so the checkout's editable finder never loads and only
the wheel's `dpstream` is importable. Every process runs from a directory outside the checkout.
"""

from __future__ import annotations

import os
import shutil
import site as site_module
import subprocess
import sys
import sysconfig
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ("localstack", "demo", "bench")
"""Packages under workers/ that need a checkout (deploy/local) and stay out of the wheel."""
API = "api"
"""workers/api/ is the package `dpstream` itself (the Python API): it ships as dpstream/, not dpstream/workers/api/."""

_SOURCES = ("pyproject.toml", "README.md", "workers", "topology", "dpstream.egg-info")


@dataclass(frozen=True)
class Installed:
    """The built wheel and the venv it is installed in."""

    wheel: Path
    names: frozenset[str]
    venv: Path
    site: Path
    work: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def dpstream(self) -> Path:
        return self.venv / "bin" / "dpstream"

    def run(self, *argv: str | Path) -> subprocess.CompletedProcess[str]:
        """Run a command of the venv from outside the checkout, with no PYTHON* variables and no user site."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONNOUSERSITE"] = "1"
        env["PATH"] = f"{self.venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        return subprocess.run(
            [str(a) for a in argv], cwd=self.work, env=env, capture_output=True, text=True, timeout=120
        )

    def python_c(self, code: str) -> subprocess.CompletedProcess[str]:
        """`python -I -c code` in the venv (isolated: no cwd, no PYTHON* variables, no user site)."""
        return self.run(self.python, "-I", "-c", code)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in _SOURCES:
        path = ROOT / name
        if not path.exists():  # the egg-info exists only after an install from the checkout
            continue
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    dist = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(src)],
        cwd=tmp,
        check=True,
        timeout=300,
    )
    (wheel,) = dist.glob("dpstream-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = frozenset(archive.namelist())

    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--force-reinstall",
            "--no-index",
            str(wheel),
        ],
        cwd=tmp,
        check=True,
        timeout=300,
    )
    site = Path(
        subprocess.run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # dependencies (faust, redis, opendp, ...) from this interpreter, without running its .pth files
    # (every site-packages directory this interpreter reads: inside a venv made with system site
    # packages, the dependencies may sit in the base interpreter's directory, not the venv's)
    dirs = dict.fromkeys([sysconfig.get_paths()["purelib"], *site_module.getsitepackages()])
    (site / "zz_dependencies.pth").write_text("".join(f"{d}\n" for d in dirs))
    work = tmp / "elsewhere"
    work.mkdir()
    return Installed(wheel, names, env_dir, site, work)


def test_only_dpstream_is_importable_and_it_comes_from_the_venv(installed: Installed) -> None:
    """`import dpstream.topology, dpstream.workers` works, from the venv's copy; no top-level workers/topology."""
    probe = installed.python_c(
        "import importlib.util, dpstream, dpstream.topology, dpstream.workers\n"
        "print(*dpstream.__path__, dpstream.topology.__file__, dpstream.workers.__file__, sep='\\n')\n"
        "print('workers' if importlib.util.find_spec('workers') else '-')\n"
        "print('topology' if importlib.util.find_spec('topology') else '-')\n"
    )
    assert probe.returncode == 0, probe.stderr
    *paths, workers, topology = probe.stdout.splitlines()
    assert paths and all(Path(p).resolve().is_relative_to(installed.venv.resolve()) for p in paths), paths
    assert (workers, topology) == ("-", "-")
    assert not any(n.split("/")[0] in ("workers", "topology") for n in installed.names)
    assert {n.split("/")[0] for n in installed.names} == {
        "dpstream",
        installed.wheel.name.split("-py")[0] + ".dist-info",
    }


def test_the_python_api_is_the_package_root(installed: Installed) -> None:
    """`dpstream` is a regular package whose modules are workers/api/'s; no dpstream.workers.api copy ships."""
    api = sorted(p.name for p in (ROOT / "workers" / API).glob("*.py"))
    assert "__init__.py" in api
    for name in api:
        assert f"dpstream/{name}" in installed.names
    assert not [n for n in installed.names if n.startswith(f"dpstream/workers/{API}/")]
    probe = installed.python_c(
        "import importlib.util, dpstream\n"
        "print(dpstream.__file__)\n"
        "print(*dpstream.__all__)\n"
        "print('copy' if importlib.util.find_spec('dpstream.workers.api') else '-')\n"
    )
    assert probe.returncode == 0, probe.stderr
    init, names, copy = probe.stdout.splitlines()
    assert Path(init).resolve() == (installed.site / "dpstream" / "__init__.py").resolve()
    assert {"replay", "plan", "validate", "open_ledger", "Rho", "Epsilon"} <= set(names.split())
    assert copy == "-"


def test_plan_runs_on_a_packaged_example(installed: Installed) -> None:
    """The venv's `dpstream plan` reads an example shipped inside the package and exits 0."""
    example = installed.site / "dpstream" / "topology" / "examples" / "web-analytics.yaml"
    assert example.is_file()
    result = installed.run(installed.dpstream, "plan", example)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_lua_scripts_and_examples_are_in_the_wheel(installed: Installed) -> None:
    """Every ledger Lua script and every topology example of the checkout is package data of the wheel."""
    lua = sorted(p.name for p in (ROOT / "workers" / "ledger" / "lua").glob("*.lua"))
    examples = sorted(p.name for p in (ROOT / "topology" / "examples").glob("*.yaml"))
    assert lua and examples
    for name in lua:
        assert f"dpstream/workers/ledger/lua/{name}" in installed.names
    for name in examples:
        assert f"dpstream/topology/examples/{name}" in installed.names


def test_every_runtime_package_is_in_the_wheel(installed: Installed) -> None:
    """Each package folder of the checkout ships, except the tools that need a checkout."""
    for top in ("workers", "topology"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.relative_to(ROOT / top).parent
            if rel.parts and rel.parts[0] in (*TOOLS, API) and top == "workers":
                continue
            assert f"dpstream/{top}/{init.relative_to(ROOT / top).as_posix()}" in installed.names, (
                f"{init.parent.relative_to(ROOT)} is a package missing from the wheel: add it to pyproject's packages"
            )


def test_checkout_tools_are_not_in_the_wheel(installed: Installed) -> None:
    """localstack, demo and bench are left out of the wheel."""
    for tool in TOOLS:
        assert not [n for n in installed.names if n.startswith(f"dpstream/workers/{tool}/")], tool


@pytest.mark.parametrize("argv", [("demo",), ("demo", "--help"), ("bench", "noise")])
def test_checkout_commands_fail_with_one_line(installed: Installed, argv: tuple[str, ...]) -> None:
    """From the wheel, `dpstream demo` / `dpstream bench` exit 2 with one line saying they need a checkout."""
    result = installed.run(installed.dpstream, *argv)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [lines[0]] and lines[0].startswith(f"dpstream {argv[0]} needs a checkout of the repository: ")
    assert "Traceback" not in result.stderr
