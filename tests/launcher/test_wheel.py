"""The installed wheel works: templates ship inside it and a run renders from outside the repo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.launcher.conftest import REPO, path_without


def fresh_venv_seeing_our_packages(venv: Path) -> Path:
    """A new venv whose python also sees the packages this suite runs with (jinja2, tomli_w, ...).

    `--system-site-packages` alone is not enough: run from inside a virtualenv, the "system" packages are the
    base interpreter's, not the virtualenv's. A .pth file adds this interpreter's own site-packages after the
    venv's, so the wheel installed into the venv still comes first (its .pth files, e.g. our editable install,
    are not processed).
    """
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=120)
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    venv_site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip()
    (Path(venv_site) / "_sft_suite_packages.pth").write_text("".join(f"{path}\n" for path in ours))
    return venv


@pytest.mark.slow
def test_wheel_installs_into_fresh_venv_and_renders_a_run(tmp_path: Path) -> None:
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "runs", "cache")
    for name in ("contract", "launcher", "templates", "train", "pyproject.toml", "README.md"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        elif (REPO / name).exists():
            shutil.copy2(REPO / name, source / name)
    if not (source / "README.md").exists():
        (source / "README.md").write_text("sft-launch\n")
    dist = tmp_path / "dist"
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--skip-dependency-check",
                            "--outdir", str(dist), str(source)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    (wheel,) = dist.glob("sft_launch-*.whl")
    venv = fresh_venv_seeing_our_packages(tmp_path / "venv")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--quiet", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {"PATH": f"{venv / 'bin'}:{path_without('sbatch')}", "HOME": str(tmp_path)}
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import launcher; print(launcher.__file__)"],
                           cwd=outside, env=env, capture_output=True, text=True, check=True)
    assert str(venv) in where.stdout, "the wheel, not the checkout, must be imported"
    result = subprocess.run([str(venv / "bin" / "sft-launch"), "--model", "tiny", "--executor", "local", "--dry-run",
                             "--output", str(outside / "run")], cwd=outside, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    rendered = Path(result.stdout.split("dry run: rendered into ")[1].split()[0])
    names = sorted(p.name for p in rendered.iterdir())
    assert names == [".batch-helpers", "accelerate.yaml", "launch.slurm", "logs", "run.json", "train.toml"]
    assert not (outside / "run").exists(), "a dry run writes no run directory"
    # The batch shell's stdlib-only helpers, copied from the installed wheel.
    assert (rendered / ".batch-helpers" / "contract" / "blame.py").is_file()
    assert (rendered / ".batch-helpers" / "launcher" / "runrecord.py").is_file()
    models = subprocess.run([str(venv / "bin" / "sft-launch"), "models"], cwd=outside, env=env, capture_output=True,
                            text=True, timeout=60)
    assert models.returncode == 0 and "llama3-70b" in models.stdout
